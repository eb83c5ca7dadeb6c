"""`/` (the overview: requests by status, pools, the oldest queued request, why nothing moves),
`/batches` and `/spend`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ledger.statuses import RequestStatus
from ledger.store.browse import Count, PoolView
from ledger.web.base import Web, int_param, plain
from ledger.web.spend import WINDOWS

# Running jobs whose progress a list page sums (each a read of up to 50,000 of its requests);
# the others link to their own page.
JOBS_SUMMED = 3
# Seconds without a new attempt, while work is queued, after which the overview says why.
STALL_S = 10.0


def routes(web: Web) -> list[BaseRoute]:
    def overview(request: Request) -> Response:
        return web.render(request, "overview.html", overview_context(web))

    def batches(request: Request) -> Response:
        rows, next_before = web.store.batch_page(before=int_param(request, "before"))
        return web.render(request, "batches.html", {"batches": rows, "next_before": next_before})

    def spend(request: Request) -> Response:
        unit = request.query_params.get("unit") or "hour"
        if unit not in WINDOWS:
            return plain(f"unit={unit[:100]!r} is not a spend unit: {' or '.join(WINDOWS)}", 400)
        return web.render(request, "spend.html", web.spend.view(unit))

    return [Route("/", overview), Route("/batches", batches), Route("/spend", spend)]


def overview_context(web: Web) -> dict[str, Any]:
    store, settings = web.store, web.settings
    by_pool = store.requests_by_pool()
    counts = totals(by_pool)
    pools = store.pool_views(by_pool)
    rules = settings.pool_rules
    rows = [
        {
            "view": p,
            "limit": settings.pool_limit(p.endpoint),
            "rpm": rules.rpm.get(p.endpoint),
            "tpm": rules.tpm.get(p.endpoint),
            "state": pool_state(p, rules.spent(p.endpoint, p.window_calls, p.window_tokens)),
        }
        for p in pools
    ]
    daemons = store.heard_from(settings.lease_seconds * 2)
    jobs = store.active_jobs()
    summaries = store.job_summary([job["id"] for job in jobs[:JOBS_SUMMED]])
    active = [{"job": job, "progress": summaries.get(job["id"])} for job in jobs[:50]]
    spent = store.spend_today() if settings.daily_budget_usd is not None else None
    oldest = store.oldest_queued()
    stalled = None
    if oldest is not None and not store.started_within(STALL_S):
        stalled = why_stalled(web, rows, daemons, spent)
    return {
        "counts": counts,
        "by_pool": by_pool,
        "pools": rows,
        "daemons": daemons,
        "active": active,
        "oldest": oldest,
        "stalled": stalled,
        "spent_today": spent,
        "budget": settings.daily_budget_usd,
    }


def totals(by_pool: dict[str, dict[str, Count]]) -> dict[str, Count]:
    """Requests per status over every pool (a total with a capped part is itself a floor: `N+`)."""
    found = {}
    for status in RequestStatus:
        parts = [pool[status.value] for pool in by_pool.values() if status.value in pool]
        found[status.value] = Count(sum(p.n for p in parts), capped=any(p.capped for p in parts))
    return found


def pool_state(pool: PoolView, window_spent: bool) -> str:
    if pool.paused_reason:
        return f"paused: {pool.paused_reason}"
    if pool.cooldown_until is not None:
        return "cooling down after a 429"
    if window_spent or pool.window_left == 0:
        return "rate window spent"
    return ""


def why_stalled(web: Web, rows: list[dict[str, Any]], daemons: int, spent: float | None) -> str:
    """One line: why queued work does not move (the first reason that holds, in the order an
    operator would check them)."""
    budget = web.settings.daily_budget_usd
    if daemons == 0:
        return "no daemon heard from: start one with `ledger daemon`"
    if budget is not None and spent is not None and spent >= budget:
        return f"today's budget is spent (${spent:.2f} of ${budget:.2f})"
    waiting = [r for r in rows if r["view"].queued.n > 0]
    for reason, test in (
        ("paused", lambda r: bool(r["view"].paused_reason)),
        ("in cooldown", lambda r: r["view"].cooldown_until is not None),
        ("rate window spent", lambda r: r["state"] == "rate window spent"),
        ("pool full", lambda r: r["view"].running.n >= r["limit"]),
    ):
        held = [r["view"].endpoint for r in waiting if test(r)]
        if held:
            return f"{reason}: {', '.join(held)}"
    return "queued work is not due yet (retry back-off) or waits for a slot"
