"""`ledger status`: what the ledger holds now (active jobs, requests per status, slots per pool,
pauses, the cache's savings today), as a table or as one JSON object."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ledger.cli_delivery import job_delivery_json
from ledger.console import json_default, open_ledger, out, settings_or_exit, text_of
from ledger.settings import Settings


def register_status_command(app: typer.Typer) -> None:
    app.command()(status)


def status(
    job: Annotated[str | None, typer.Option(help="Only this job's counts.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Active jobs, requests per status, slots busy/total per pool, budget left today, job capacity."""
    from ledger.cli_jobs import job_status, print_job_status

    settings = settings_or_exit()
    store = open_ledger(settings)
    counts = store.status_counts(job)
    usage = store.pool_usage()
    busy = sum(u["running"] for u in usage.values())
    hits, saved = store.cache_hits_today()
    if as_json:
        said = {
            "requests": counts,
            "slots": _slots_json(settings, usage, busy),
            **job_status(store, settings),
            "cache": {"hits_today": hits, "saved_usd_today": round(saved, 10)},
        }
        if job is not None:
            said["job"] = job_delivery_json(store, settings, job)
        out.print_json(json.dumps(said, default=json_default))
        return
    print_job_status(job_status(store, settings))
    out.print("requests: " + ", ".join(f"{k} {v}" for k, v in counts.items()), highlight=False)
    if hits:
        out.print(f"cache: {hits} answered from the cache today, ${saved:.4f} not spent again", highlight=False)
    _print_warnings(store, job)
    _print_pools(settings, usage, busy)


def _slots_json(settings: Settings, usage: dict[str, dict[str, Any]], busy: int) -> dict[str, Any]:
    return {
        "global": {"busy": busy, "total": settings.max_concurrent_llm_calls},
        "pools": {
            endpoint: {
                "busy": u["running"],
                "total": settings.pool_limit(endpoint),
                "queued": u["queued"],
                "paused_until": u["paused_until"],
                "paused_reason": u["paused_reason"],
            }
            for endpoint, u in sorted(usage.items())
        },
    }


def _print_warnings(store: Any, job: str | None) -> None:
    """Completed requests without a cost, and running ones with a cancel pending."""
    unpriced = store.unpriced_count(job)
    if unpriced:
        out.print(
            f"{unpriced} completed request(s) have no cost: their models are not in the price table "
            "(add them with LEDGER_PRICES_FILE)",
            highlight=False,
        )
    pending = store.cancel_pending(job)
    if pending:
        line = f"{pending} running with a cancel pending: they end canceled when their call returns"
        out.print(line, highlight=False)


def _print_pools(settings: Settings, usage: dict[str, dict[str, Any]], busy: int) -> None:
    out.print(f"slots: {busy}/{settings.max_concurrent_llm_calls} busy (global)", highlight=False)
    table = Table("pool", "busy/limit", "learned limit (after 429s)", "queued", "cooldown until")
    for endpoint, u in sorted(usage.items()):
        table.add_row(
            endpoint,
            f"{u['running']}/{settings.pool_limit(endpoint)}",
            text_of(u["learned_limit"]),
            str(u["queued"]),
            text_of(u["cooldown_until"]),
        )
    out.print(table)
    for endpoint, u in sorted(usage.items()):
        if u["paused_reason"]:
            out.print(
                f"pool {endpoint} paused until {text_of(u['paused_until'])}: {u['paused_reason']} "
                f"(ledger pools resume {endpoint} lifts it)",
                highlight=False,
                soft_wrap=True,
            )
