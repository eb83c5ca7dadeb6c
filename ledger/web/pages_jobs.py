"""`/jobs`, `/jobs/{id}` (progress, spend, errors by kind, the score matrix), a matrix cell's
opinions and requests (`/jobs/{id}/cell`), and two jobs side by side (`/jobs/{a}/compare/{b}`).

The matrix's numbers are `ledger.scores.cell_summary` of `Store.opinions`: what `ledger report`
prints and `report --json` lists, worked out by the same function.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ledger.jobs import job_duration_s, job_spec
from ledger.savings import job_savings
from ledger.scores import cell_summary, cell_text, cells_of, disagree
from ledger.statuses import JobStatus
from ledger.store.browse import JOB_ROWS
from ledger.web.base import Web
from ledger.web.pages_overview import JOBS_SUMMED

# How long `/jobs` shows the progress of an ended job with requests still in flight (a canceled
# job's calls finishing) before summing it again.
OPEN_KEPT_S = 60.0


def routes(web: Web) -> list[BaseRoute]:
    web.env.globals["cell_text"] = cell_text

    def job_list(request: Request) -> Response:
        before = None
        at, job_id = request.query_params.get("before_at"), request.query_params.get("before_id")
        if at and job_id:
            try:
                before = (datetime.fromisoformat(at), job_id)
            except ValueError:
                before = None
        rows = web.store.job_list(before=before)
        last = rows[-1] if len(rows) == 50 else None
        return web.render(request, "jobs.html", {"jobs": rows, "progress": list_progress(web, rows), "last": last})

    def job_page(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        context = job_context(web, job_id)
        if context is None:
            return web.not_found(f"job {job_id}")
        return web.render(request, "job.html", context)

    def cell(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        agent = request.query_params.get("agent", "")
        dimension = request.query_params.get("dimension", "")
        if web.store.get_job(job_id) is None:
            return web.not_found(f"job {job_id}")
        found = web.store.cell_opinions(job_id, agent, dimension)
        summary = cell_summary(found)
        context = {"job_id": job_id, "agent": agent, "dimension": dimension, "opinions": found, "summary": summary}
        return web.render(request, "cell.html", context)

    def compare(request: Request) -> Response:
        a, b = request.path_params["a"], request.path_params["b"]
        context = compare_context(web, a, b)
        if context is None:
            return web.not_found(f"job {a} or {b}")
        return web.render(request, "compare.html", context)

    return [
        Route("/jobs", job_list),
        Route("/jobs/{job_id}", job_page),
        Route("/jobs/{job_id}/cell", cell),
        Route("/jobs/{a}/compare/{b}", compare),
    ]


def list_progress(web: Web, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The progress `/jobs` shows: its first `JOBS_SUMMED` running jobs', summed on each view, and
    the ended jobs', kept in `web.ended_progress` by the job's id and last update: for good once
    nothing of the job is in flight (its figures no longer move), else for `OPEN_KEPT_S`. A view
    sums the ended jobs it holds nothing for up to `JOB_ROWS` requests in all, so a page of large
    finished jobs is summed over a few views, not in one."""
    running = [row["id"] for row in rows if row["status"] == JobStatus.RUNNING.value][:JOBS_SUMMED]
    found = web.store.job_summary(running)
    budget, now = JOB_ROWS, time.monotonic()
    for row in rows:
        if row["status"] == JobStatus.RUNNING.value:
            continue
        key = (row["id"], str(row["updated_at"]))
        kept = web.ended_progress.get(key)
        if kept is not None and kept[0]["open"] and now - kept[1] > OPEN_KEPT_S:
            kept = None
        if kept is None and budget > 0:
            kept = (web.store.job_summary([row["id"]])[row["id"]], now)
            budget -= kept[0]["total"]
            web.ended_progress[key] = kept
        if kept is not None:
            found[row["id"]] = kept[0]
    return found


def job_context(web: Web, job_id: str) -> dict[str, Any] | None:
    job = web.store.get_job(job_id)
    if job is None:
        return None
    progress = web.store.job_summary([job_id], errors=True)[job_id]
    return {
        "job": job,
        "progress": progress,
        "duration_s": job_duration_s(job),
        "errors": progress["errors"][:20],
        "error_lines": (job.get("errors") or [])[:50],
        "error_lines_total": len(job.get("errors") or []),
        "matrix": matrix(web, job),
        "delivery": {
            **web.store.job_delivery(job_id),
            **job_savings(web.store.job_costs(job_id), web.settings.prices),
        },
    }


def matrix(web: Web, job: dict[str, Any]) -> dict[str, Any] | None:
    """Dimensions x agents of an evaluation job (None for requests enqueued with --job)."""
    if not isinstance(job.get("spec"), dict) or "job" not in job["spec"]:
        return None
    spec = job_spec(job)
    cells = cells_of(web.store.opinions(job["id"]))
    agents = [a.name for a in spec.agents]
    rows = []
    for dimension in spec.dimensions:
        summaries = {agent: cell_summary(cells.get((agent, dimension.id), [])) for agent in agents}
        split = disagree(summaries.values())
        rows.append({"dimension": dimension.id, "name": dimension.name, "cells": summaries, "disagree": split})
    return {"agents": agents, "rows": rows, "samples": spec.samples}


def compare_context(web: Web, a: str, b: str) -> dict[str, Any] | None:
    job_a, job_b = web.store.get_job(a), web.store.get_job(b)
    if job_a is None or job_b is None:
        return None
    left, right = matrix(web, job_a), matrix(web, job_b)
    if left is None or right is None:
        return {"a": job_a, "b": job_b, "rows": [], "agents": [], "problem": "both jobs must be evaluations"}
    agents = [x for x in left["agents"] if x in right["agents"]]
    right_rows = {row["dimension"]: row for row in right["rows"]}
    rows = []
    for row in left["rows"]:
        other = right_rows.get(row["dimension"])
        if other is None:
            continue
        cells = []
        for agent in agents:
            x, y = row["cells"][agent], other["cells"][agent]
            change = None if x.mean is None or y.mean is None else y.mean - x.mean
            cells.append({"agent": agent, "a": x, "b": y, "change": change})
        rows.append({"dimension": row["dimension"], "cells": cells})
    same = {r["dimension"] for r in left["rows"]} == set(right_rows)
    problem = None if same else "the jobs' dimensions differ: only the shared ones are shown"
    return {"a": job_a, "b": job_b, "rows": rows, "agents": agents, "problem": problem}
