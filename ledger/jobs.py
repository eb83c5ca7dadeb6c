"""Evaluation jobs: trigger (capacity, budget, staging) and one coordinator over every active job.

The coordinator follows seed 004: jobs are rows, not tasks. One loop in the
daemon reads the active jobs and advances each one step per cycle, inside its
own error boundary (D4), so a job whose step raises fails alone. A job's phase
is derived from the ledger each time (what is open, what is parsed, which
opinions exist), so a restarted daemon, or a second one, resumes every job from
where the database says it stands (D5, D6):

    staged -> calling -> parsing -> (filling_gaps -> parsing)* -> completed | failed | canceled

Calls are not made here: the claim loop and the batch loop serve the job's
requests like any others. Capacity and the daily budget are checked once, at
trigger (D2, D7); while the job runs, the claim reserves each request's
worst-case cost against the daily budget and the job's own, so a job never
overspends, it waits (daily) or ends `failed` (its own budget spent).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from adapters.registry import STRUCTURED_OUTPUT_PROVIDERS
from ledger import events
from ledger.enqueue import RequestSpec, count_dropped, to_row, warn_dropped
from ledger.evaluation import Plan, elapsed_seconds, plan, requests_for, single_request
from ledger.parsing import derive
from ledger.record import DbLane
from ledger.settings import Settings
from ledger.spec import JobSpec
from ledger.statuses import JobStatus
from ledger.store import Store
from ledger.store.dialect import as_utc
from ledger.store.errors import DatabaseUnavailable
from ledger.store.jobs import Staged, TriggerRefused
from ledger.waits import first_done

__all__ = ["Coordinator", "Staged", "TriggerRefused", "advance", "reparse", "trigger"]


def limits_of(settings: Settings) -> dict[str, Any]:
    """The limits a job is triggered under, kept with it (FR-009: they hold for the whole job)."""
    return {
        "max_concurrent_llm_calls": settings.max_concurrent_llm_calls,
        "retry_max_attempts": settings.retry_max_attempts,
        "llm_call_timeout": settings.llm_call_timeout,
        "batching_enabled": settings.batching_enabled,
        "job_capacity": settings.job_capacity,
        "daily_budget_usd": settings.daily_budget_usd,
    }


def first_requests(spec: JobSpec, settings: Settings) -> list[RequestSpec]:
    """The requests a job is staged with (every judge x dimension x sample; structured batching
    asks a provider that follows a schema for every dimension at once)."""
    structured_for = STRUCTURED_OUTPUT_PROVIDERS if settings.batching_enabled else frozenset()
    return list(requests_for(spec, structured_for))


def trigger(store: Store, settings: Settings, spec: JobSpec) -> Staged:
    """Stage the job and its first requests in one transaction, or raise `TriggerRefused`.

    Re-triggering a job id adds nothing (`Staged.created` is False).
    """
    per_model = settings.compatible_pools_per_model
    rows = [
        to_row(r, settings.compatible_base_url, settings.prices, pools_per_model=per_model)
        for r in first_requests(spec, settings)
    ]
    warn_dropped(count_dropped(rows))
    job = {
        "id": spec.id,
        "spec": {"job": spec.to_json(), "limits": limits_of(settings)},
        "budget_usd": spec.budget_usd,
    }
    staged = store.stage_job(
        job,
        rows,
        capacity=settings.job_capacity,
        daily_budget=settings.daily_budget_usd,
        cache=settings.cache_policy,
    )
    for hit in staged.hits:
        events.cache_hit(hit.request_id, hit.cached_from)
    return staged


def job_spec(job: dict[str, Any]) -> JobSpec:
    return JobSpec.from_json(job["spec"]["job"])


def job_duration_s(job: dict[str, Any], now: float | None = None) -> float | None:
    """How long a job has run (`ledger status`, the web view): from its start (or creation) to its
    end, or to `now` while it runs; None before it has either."""
    started = job.get("started_at") or job.get("created_at")
    if started is None:
        return None
    ended = job.get("completed_at")
    end = as_utc(ended).timestamp() if ended is not None else (time.time() if now is None else now)
    return max(0.0, end - as_utc(started).timestamp())


@dataclass(frozen=True)
class Step:
    """What one step did to a job (for logs and tests)."""

    job_id: str
    phase: str
    ended: JobStatus | None = None


def advance(store: Store, settings: Settings, job: dict[str, Any]) -> Step:
    """One step of one job, from what the ledger holds now."""
    job_id = job["id"]
    spec = job_spec(job)
    if job["phase"] == "staged":
        if store.set_job_phase(job_id, "calling", starting=True):
            progress = store.job_progress(job_id)
            events.job_started(job_id, progress["total"], **job["spec"].get("limits", {}), delivery=spec.delivery)
        return Step(job_id, "calling")
    progress = store.job_progress(job_id)
    if progress["open"]:
        return _while_open(store, job, progress, settings.daily_budget_usd)
    if job["phase"] not in ("parsing",):
        store.set_job_phase(job_id, "parsing")
    rows = store.job_requests(job_id)
    found = plan(spec, rows)
    _save(store, job_id, found, rows)
    if found.gaps:
        gap_specs = [single_request(spec, agent, dimension, sample) for agent, dimension, sample in found.gaps]
        per_model = settings.compatible_pools_per_model
        gap_rows = [
            to_row(r, settings.compatible_base_url, settings.prices, pools_per_model=per_model) for r in gap_specs
        ]
        warn_dropped(count_dropped(gap_rows))
        added = store.add_job_requests(job_id, gap_rows, settings.cache_policy)
        for hit in added.hits:
            events.cache_hit(hit.request_id, hit.cached_from)
        store.set_job_phase(job_id, "filling_gaps")
        return Step(job_id, "filling_gaps")
    if found.pending:  # a request reopened since we looked (a retry): next cycle
        return Step(job_id, "parsing")
    if store.end_job(job_id, JobStatus.COMPLETED):
        errors = sum(1 for o in found.opinions if o["score"] is None)
        events.job_ended(job_id, JobStatus.COMPLETED.value, len(found.opinions), errors)
        return Step(job_id, "completed", JobStatus.COMPLETED)
    return Step(job_id, "parsing")


def _while_open(store: Store, job: dict[str, Any], progress: dict[str, Any], daily: float | None) -> Step:
    """Requests are still open: the job waits, unless no budget can ever pay for what waits
    (its own, spent; or the day's, smaller than one request's worst case)."""
    job_id, budget = job["id"], job["budget_usd"]
    if progress["running"] or (budget is None and daily is None):
        return Step(job_id, job["phase"])
    cheapest = store.cheapest_waiting(job_id)
    spent = progress["spent_usd"]
    why = None
    if cheapest is not None and budget is not None and spent + cheapest > budget:
        why = f"budget exhausted (${spent:.4f} of ${budget:.4f} spent; the next request may cost ${cheapest:.4f})"
    elif cheapest is not None and daily is not None and cheapest > daily:
        why = f"budget exhausted (a request may cost ${cheapest:.4f}, more than the daily budget ${daily:.2f})"
    if why is not None and store.fail_job_for_budget(job_id, why):
        events.job_ended(job_id, JobStatus.FAILED.value, len(store.opinions(job_id)), 0, why)
        return Step(job_id, "failed", JobStatus.FAILED)
    return Step(job_id, job["phase"])


def _save(store: Store, job_id: str, found: Plan, requests: list[dict[str, Any]], *, overwrite: bool = False) -> None:
    """Write what the plan derived (from `requests`); log what is new (once, whoever wrote it)."""
    first_parsed, inserted = store.save_parse(job_id, found.derived, found.opinions, overwrite=overwrite)
    if overwrite:
        return
    agents = {o["request_id"]: o["agent"] for o in found.opinions}
    for request_id in sorted(first_parsed & set(found.rejected)):
        for entry in found.rejected[request_id]:
            events.entry_rejected(job_id, agents.get(request_id, "?"), request_id, entry.reason, entry.raw)
    rows = {r["id"]: r for r in requests}
    for opinion in inserted:
        row = rows.get(opinion["request_id"], {})
        if opinion.get("error_line"):
            elapsed = elapsed_seconds(row.get("created_at"), row.get("completed_at"))
            events.evaluation_failed(
                job_id,
                opinion["agent"],
                opinion["dimension"],
                opinion["request_id"],
                row.get("last_status_code"),
                int(row.get("attempts") or 0),
                elapsed,
            )
        elif opinion.get("parse_error"):
            events.verdict_unparsed(
                job_id, opinion["agent"], opinion["dimension"], opinion["request_id"], opinion["parse_error"]
            )


def reparse_requests(store: Store, job_id: str) -> int:
    """Recompute the derived fields of a job's requests that name a parser (`parse`), from their
    stored answers; no provider call. Any job: a pipeline stage's as well as an evaluation's.
    Returns how many requests were parsed again."""
    if store.get_job(job_id) is None:
        raise LookupError(f"no job {job_id!r}")
    derived = {
        row["id"]: derive(
            row["parse"],
            row["raw_output"],
            response_format=row["response_format"],
            finish_reason=row["finish_reason"],
            params=row["params"],
        )
        for row in store.parse_inputs(job_id)
    }
    return store.save_derived(derived)


def is_evaluation(job: dict[str, Any] | None) -> bool:
    return job is not None and isinstance(job.get("spec"), dict) and "job" in job["spec"]


def reparse(store: Store, job_id: str) -> int:
    """Recompute every derived field and opinion of a job from stored raw output; no provider call.

    Returns the number of opinions written. Gaps are not filled (that would call a
    provider): a cell without a final source keeps no opinion.
    """
    job = store.get_job(job_id)
    if not is_evaluation(job):
        raise LookupError(f"no evaluation job {job_id!r}")
    assert job is not None
    if job["status"] == JobStatus.RUNNING.value:
        raise JobStillRunning(f"job {job_id!r} is still running: reparse it once it has ended")
    rows = store.job_requests(job_id)
    found = plan(job_spec(job), rows)
    _save(store, job_id, found, rows, overwrite=True)
    return len(found.opinions)


class JobStillRunning(ValueError):
    """`reparse` of a job whose coordinator may still be writing its opinions."""


class Coordinator:
    """The loop that advances every active job, one step each per cycle."""

    def __init__(self, store: Store, lane: DbLane, settings: Settings) -> None:
        self.store, self.lane, self.settings = store, lane, settings
        self._look = anyio.Event()
        self._jobs_active = False  # as of the last cycle

    def look_now(self) -> None:
        """Step the jobs at once instead of at the next poll (the claim loop found nothing left)."""
        self._look.set()

    def calls_answered(self) -> None:
        """The daemon's calls have all been answered: a job may be ready to parse, to fill its
        gaps or to end. Ignored while no job is active (at zero latency this comes after
        nearly every group commit, and a cycle costs the lane a query)."""
        if self._jobs_active:
            self._look.set()

    async def run(self, *, stop: anyio.Event, until_idle: bool, stepped: Callable[[], None] = lambda: None) -> None:
        """`stepped` is called after each round of steps (a step may have queued requests: gaps to
        fill) and when the loop ends (the claim loop may be waiting on jobs, not requests)."""
        try:
            while not stop.is_set():
                self._look = anyio.Event()
                active = await self.lane.run(self.store.active_jobs)
                self._jobs_active = bool(active)
                moved = False
                for job in active:
                    done = await self.step(job)
                    moved |= done is not None and (done.ended is not None or done.phase != job["phase"])
                if active:
                    stepped()
                if until_idle and not active and not await self.lane.run(self.store.has_work):
                    return
                if moved:  # a job changed phase: its next step may be due already
                    continue
                with anyio.move_on_after(self.settings.poll_interval):
                    await first_done(stop.wait, self._look.wait)
        finally:
            stepped()

    async def step(self, job: dict[str, Any]) -> Step | None:
        """One job's step inside its own error boundary: a bug in one job fails that job only.

        A database failure is not the job's fault: the lane retries it, and past its
        window it stops the daemon like every other stage.
        """
        try:
            return await self.lane.run(advance, self.store, self.settings, job)
        except DatabaseUnavailable:
            raise
        except Exception as exc:  # the error boundary of one job (D4)
            message = f"{type(exc).__name__}: {exc}".splitlines()[0]
            events.job_error(job["id"], message)
            await self.lane.run(self.store.end_job, job["id"], JobStatus.FAILED, message)
            return None
