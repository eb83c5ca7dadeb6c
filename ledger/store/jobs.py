"""Evaluation jobs' SQL: staging with its capacity and budget checks, phases, parse results, opinions.

Invariants every statement here keeps:
- A job is staged with all its requests in one transaction, under the claim lock,
  after counting active jobs and today's spend: two triggers racing for the last
  slot of capacity cannot both pass.
- An opinion is inserted only if absent (unique per job, agent, dimension): the
  log line and the job error that go with a new one are written by the one
  transaction that inserted it, so neither repeats whatever crashes or however
  many coordinators run.
- A job's status moves only while it is still `running`: cancel wins over a
  coordinator finishing the job at the same moment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.engine import Connection, Engine

from ledger.statuses import FINAL_STATUSES, JobStatus, RequestStatus
from ledger.store import pools as pool_state
from ledger.store.budget import spent_today
from ledger.store.cache import CachePolicy, Hit
from ledger.store.commit import reading, transaction
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.queue import EnqueueResult
from ledger.store.tables import jobs, opinions, requests, workers

EVAL_KIND = "eval"
RUNNING_JOB = JobStatus.RUNNING.value
_ACTIVE = and_(jobs.c.kind == EVAL_KIND, jobs.c.status == RUNNING_JOB)
ACTIVE_JOBS = select(jobs.c.id).where(_ACTIVE)  # an evaluation job still to advance
# What the coordinator and the parsers read of a job's requests.
_PARSE_COLUMNS = (
    requests.c.id,
    requests.c.status,
    requests.c.trace,
    requests.c.raw_output,
    requests.c.finish_reason,
    requests.c.params,
    requests.c.attempts,
    requests.c.last_status_code,
    requests.c.error_code,
    requests.c.error_message,
    requests.c.created_at,
    requests.c.completed_at,
    requests.c.parsed_at,
)
_RESULT_COLUMNS = (
    requests.c.id,
    requests.c.idempotency_key,
    requests.c.job_id,
    requests.c.status,
    requests.c.trace,
    requests.c.raw_output,
    requests.c.api,
    requests.c.finish_reason,
    requests.c.provider_finish_reason,
    requests.c.tool_calls,
    requests.c.refusal,
    requests.c.thinking,
    requests.c.reasoning,
    requests.c.verdict_text,
    requests.c.parsed_verdict,
    requests.c.parse,
    requests.c.parsed,
    requests.c.parse_error,
    requests.c.sources,
    requests.c.error_code,
    requests.c.error_message,
    requests.c.attempts,
    requests.c.input_tokens,
    requests.c.output_tokens,
    requests.c.cached_input_tokens,
    requests.c.cache_write_tokens,
    requests.c.reasoning_tokens,
    requests.c.cost_usd,
    requests.c.completed_at,
)
_DERIVED = ("reasoning", "verdict_text", "parsed_verdict", "parse_error", "parsed")
_OPINION_FIELDS = ("score", "argument", "cited_evidence", "request_id", "parse_error")
_CELL = ("job_id", "agent", "dimension", "sample")  # an opinion's unique key


class TriggerRefused(Exception):
    """A trigger refused before anything was written: at capacity, or the day's budget spent."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Staged:
    job_id: str
    created: bool  # False: the job id was triggered before, nothing was added
    requests: int  # the job's requests (new or, when not created, already there)
    hits: list[Hit] = field(default_factory=list)  # of the new requests: answered from the cache


class JobQueries:
    """Mixed into `Store`; needs `engine`, `dialect` and `enqueue_in` (QueueQueries)."""

    engine: Engine
    dialect: Dialect

    enqueue_in: Callable[..., EnqueueResult]

    # -- trigger ---------------------------------------------------------------

    def stage_job(
        self,
        job: dict[str, Any],
        rows: list[dict[str, Any]],
        *,
        capacity: int,
        daily_budget: float | None,
        cache: CachePolicy | None = None,
    ) -> Staged:
        """Write the job and its requests at once, or refuse with nothing written."""
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job["id"])).first() is not None:
                count = conn.execute(select(func.count()).where(requests.c.job_id == job["id"])).scalar_one()
                return Staged(job["id"], False, int(count))
            active = int(conn.execute(select(func.count()).select_from(jobs).where(_ACTIVE)).scalar_one())
            if active >= capacity:
                raise TriggerRefused(
                    "at_capacity", f"Cannot trigger: at capacity ({active} active jobs, limit is {capacity})"
                )
            if daily_budget is not None:
                spent = spent_today(conn)
                if spent >= daily_budget:
                    raise TriggerRefused(
                        "budget_exhausted",
                        f"Cannot trigger: budget exhausted (${spent:.2f} of ${daily_budget:.2f} spent today)",
                    )
            conn.execute(
                jobs.insert().values(
                    **job, kind=EVAL_KIND, status=RUNNING_JOB, phase="staged", created_at=db_now(), updated_at=db_now()
                )
            )
            result = self.enqueue_in(conn, rows, cache=cache)
        return Staged(job["id"], True, len(rows), result.hits)

    def add_job_requests(
        self, job_id: str, rows: list[dict[str, Any]], cache: CachePolicy | None = None
    ) -> EnqueueResult:
        """Gap-filling requests of a job still running (idempotent keys: a repeat adds nothing)."""
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)
            if not _still_running(conn, job_id):  # canceled (or ended) since the coordinator read it
                return EnqueueResult(0, 0, 0, [])
            return self.enqueue_in(conn, rows, cache=cache)

    # -- reading ---------------------------------------------------------------

    def active_jobs(self) -> list[dict[str, Any]]:
        with reading(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(select(jobs).where(_ACTIVE).order_by(jobs.c.created_at))]

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
            return dict(row._mapping) if row is not None else None

    def job_progress(self, job_id: str) -> dict[str, Any]:
        """Requests done/total, open, running (in flight online or in a provider batch), cut off at
        max_tokens, and spend so far: the job's every request."""
        c = requests.c
        with reading(self.engine) as conn:
            return progress_of(conn.execute(select(*progress_columns(c)).where(c.job_id == job_id)).one())

    def job_paused_pools(self, job_id: str) -> list[dict[str, Any]]:
        """The paused pools (a spent quota) this job's queued requests wait on."""
        c, p = requests.c, pool_state.pools.c
        query = (
            select(p.endpoint, p.cooldown_until, p.paused_reason)
            .where(p.paused_reason.is_not(None), p.cooldown_until > db_now())
            .where(p.endpoint.in_(select(c.endpoint).where(c.job_id == job_id, c.status == RequestStatus.QUEUED.value)))
            .order_by(p.endpoint)
        )
        with reading(self.engine) as conn:
            return [{"pool": e, "until": u, "reason": r} for e, u, r in conn.execute(query)]

    def job_requests(self, job_id: str) -> list[dict[str, Any]]:
        with reading(self.engine) as conn:
            query = select(*_PARSE_COLUMNS).where(requests.c.job_id == job_id).order_by(requests.c.id)
            return [dict(r._mapping) for r in conn.execute(query)]

    def cheapest_waiting(self, job_id: str) -> float | None:
        """The smallest estimate among the job's queued requests (None: none waits, or none priced)."""
        c = requests.c
        with reading(self.engine) as conn:
            found = conn.execute(
                select(func.min(c.estimate_usd)).where(c.job_id == job_id, c.status == RequestStatus.QUEUED.value)
            ).scalar_one()
        return None if found is None else float(found)

    def spend_today(self) -> float:
        with reading(self.engine) as conn:
            return spent_today(conn)

    def live_daemons(self, within_s: float) -> int:
        """Daemons whose heartbeat is younger than `within_s` (a lease; an enqueue's hour, `intake`): is
        anyone working?"""
        with reading(self.engine) as conn:
            return int(
                conn.execute(select(func.count()).where(workers.c.heartbeat_at > db_now_plus(-within_s))).scalar_one()
            )

    def request_results(self, *, ids: list[int] | None = None, job_id: str | None = None) -> list[dict[str, Any]]:
        """Each request's outcome and derived fields, with `settled`: final, and parsed if its job
        will parse it (a completed request of an active evaluation job is settled once parsed)."""
        c = requests.c
        in_active_job = select(jobs.c.id).where(jobs.c.id == c.job_id, _ACTIVE).exists()
        settled = and_(
            c.status.in_(FINAL_STATUSES),
            or_(c.status != RequestStatus.COMPLETED.value, c.parsed_at.is_not(None), ~in_active_job),
        )
        query = select(*_RESULT_COLUMNS, case((settled, True), else_=False).label("settled")).order_by(c.id)
        query = query.where(c.id.in_(ids)) if ids is not None else query.where(c.job_id == job_id)
        with reading(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def opinions(self, job_id: str) -> list[dict[str, Any]]:
        with reading(self.engine) as conn:
            query = select(opinions).where(opinions.c.job_id == job_id).order_by(opinions.c.id)
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- advancing -------------------------------------------------------------

    def set_job_phase(self, job_id: str, phase: str, *, starting: bool = False) -> bool:
        """Move a running job to `phase`; `starting` only from `staged` (True: this call started it)."""
        where = [jobs.c.id == job_id, jobs.c.status == RUNNING_JOB]
        values: dict[str, Any] = {"phase": phase, "updated_at": db_now()}
        if starting:
            where.append(jobs.c.phase == "staged")
            values["started_at"] = db_now()
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            return bool(conn.execute(update(jobs).where(*where).values(**values)).rowcount)

    def end_job(self, job_id: str, status: JobStatus, error: str | None = None) -> bool:
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            return self._end_job_in(conn, job_id, status, error)

    def _end_job_in(self, conn: Connection, job_id: str, status: JobStatus, error: str | None) -> bool:
        ended = conn.execute(
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status == RUNNING_JOB)
            .values(status=status.value, phase=status.value, error=error, completed_at=db_now(), updated_at=db_now())
        ).rowcount
        return bool(ended)

    def parse_inputs(self, job_id: str) -> list[dict[str, Any]]:
        """The job's completed requests that name a parser, with what their parse reads."""
        c = requests.c
        query = (
            select(c.id, c.parse, c.raw_output, c.response_format, c.finish_reason, c.params)
            .where(c.job_id == job_id, c.parse.is_not(None), c.status == RequestStatus.COMPLETED.value)
            .order_by(c.id)
        )
        with reading(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def save_derived(self, derived: dict[int, dict[str, Any]]) -> int:
        """Write recomputed derived fields (`ledger reparse`) in one transaction; returns how many."""
        c = requests.c
        with transaction(self.engine, self.dialect) as conn:
            for request_id, fields in derived.items():
                values = {name: fields.get(name) for name in _DERIVED}
                conn.execute(update(requests).where(c.id == request_id).values(**values, parsed_at=db_now()))
        return len(derived)

    def save_parse(
        self,
        job_id: str,
        derived: dict[int, dict[str, Any]],
        new_opinions: list[dict[str, Any]],
        *,
        overwrite: bool = False,
    ) -> tuple[set[int], list[dict[str, Any]]]:
        """Write derived fields beside raw output and the opinions that are now known, in one transaction.

        Returns the requests parsed for the first time and the opinions inserted (as
        given): the caller logs warnings and errors for those only. With `overwrite`
        (`ledger reparse`) every derived field and opinion is recomputed in place.
        """
        c = requests.c
        first_parsed: set[int] = set()
        inserted: list[dict[str, Any]] = []
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)
            if not overwrite and not _still_running(conn, job_id):  # a cancel came first: it wins
                return first_parsed, inserted
            for request_id, fields in derived.items():
                where = [c.id == request_id] if overwrite else [c.id == request_id, c.parsed_at.is_(None)]
                values = {name: fields.get(name) for name in _DERIVED}
                if conn.execute(update(requests).where(*where).values(**values, parsed_at=db_now())).rowcount:
                    first_parsed.add(request_id)
            for opinion in new_opinions:
                cell = {
                    "job_id": job_id,
                    "agent": opinion["agent"],
                    "dimension": opinion["dimension"],
                    "sample": opinion.get("sample", 0),
                }
                row = {**cell, **{k: opinion.get(k) for k in _OPINION_FIELDS}}
                if overwrite:
                    stmt = self.dialect.upsert(
                        opinions, list(_CELL), cell, {name: opinion.get(name) for name in _OPINION_FIELDS}
                    )
                    conn.execute(stmt)
                    continue
                stmt = self.dialect.insert_ignore(opinions, list(_CELL)).values(**row, created_at=db_now())
                if conn.execute(stmt).rowcount:
                    inserted.append(opinion)
            if overwrite:  # recomputed from scratch: cells no longer concluded lose their opinion
                kept = {(o["agent"], o["dimension"], o.get("sample", 0)) for o in new_opinions}
                for agent, dimension, sample in conn.execute(
                    select(opinions.c.agent, opinions.c.dimension, opinions.c.sample).where(opinions.c.job_id == job_id)
                ).all():
                    if (agent, dimension, sample) not in kept:
                        conn.execute(
                            opinions.delete().where(
                                opinions.c.job_id == job_id,
                                opinions.c.agent == agent,
                                opinions.c.dimension == dimension,
                                opinions.c.sample == sample,
                            )
                        )
                rebuilt = [o["error_line"] for o in new_opinions if o.get("error_line")]
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(errors=rebuilt or None))
            errors = [o["error_line"] for o in inserted if o.get("error_line")]
            if errors:
                current = conn.execute(select(jobs.c.errors).where(jobs.c.id == job_id)).scalar_one_or_none() or []
                conn.execute(update(jobs).where(jobs.c.id == job_id).values(errors=[*current, *errors]))
        return first_parsed, inserted

    def fail_job_for_budget(self, job_id: str, why: str) -> bool:
        """The job's own budget cannot pay for what waits: its queued requests end, the job fails."""
        c = requests.c
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)
            conn.execute(
                update(requests)
                .where(c.job_id == job_id, c.status == RequestStatus.QUEUED.value)
                .values(
                    status=RequestStatus.CANCELED.value,
                    error_code="budget_exhausted",
                    error_message=why,
                    completed_at=db_now(),
                    updated_at=db_now(),
                )
            )
            return self._end_job_in(conn, job_id, JobStatus.FAILED, why)

    def cancel_job(self, job_id: str) -> bool:
        """The job ends `canceled` (its requests are canceled by `cancel(job_id=...)`)."""
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # ordered with the coordinator's writes: a cancel wins
            return self._end_job_in(conn, job_id, JobStatus.CANCELED, "canceled by the operator")


def _still_running(conn: Connection, job_id: str) -> bool:
    status = conn.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one_or_none()
    return status == RUNNING_JOB


# Statuses of requests whose call may be spending (their reservation counts): online in flight, or
# inside a provider batch.
SPENDING_STATUSES = (RequestStatus.RUNNING.value, RequestStatus.SUBMITTED.value)


def progress_columns(c: Any) -> tuple[Any, ...]:
    """A job's progress over rows `c` (the requests table's columns, or those of a slice of it):
    how many, finished, in flight, cut off at max_tokens (finish_reason `length`: a user raises
    max_tokens), and spend (costs plus what calls in flight reserve, as budgets count it). One
    definition for `job_progress` and the web view's bounded `job_summary`."""
    spending = c.status.in_(SPENDING_STATUSES)
    return (
        func.count(),
        func.sum(case((c.status.in_([s.value for s in FINAL_STATUSES]), 1), else_=0)),
        func.sum(case((spending, 1), else_=0)),
        func.sum(case((c.finish_reason == "length", 1), else_=0)),
        func.coalesce(func.sum(c.cost_usd), 0.0) + func.coalesce(func.sum(case((spending, c.reserved_usd))), 0.0),
    )


def progress_of(row: Any) -> dict[str, Any]:
    """`progress_columns`' row as the progress a job reports."""
    total, done, running, cut, spent = row
    return {
        "total": int(total or 0),
        "done": int(done or 0),
        "open": int(total or 0) - int(done or 0),
        "running": int(running or 0),
        "spent_usd": float(spent or 0.0),
        "truncated": int(cut or 0),
    }
