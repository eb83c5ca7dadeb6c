"""The hot path's SQL around the claim (`claim.py`): enqueue, record outcomes, attempts, cancel.

Invariants every statement here keeps:
- Every write to a claimed row carries its fencing token and `status='running'`:
  a worker whose lease was taken over, or whose request was canceled, changes
  nothing (cancel wins over a late completion).
- Times are the database's (`db_now`), never the process's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    case,
    column,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnClause

from ledger.models import Job
from ledger.statuses import AnsweredVia, AttemptOutcome, Delivery, RequestStatus
from ledger.store import answers, pool_windows
from ledger.store import pools as pool_state
from ledger.store.cache import ENDED, TWINS_ANSWERED, TWINS_RELEASED, CachePolicy, Hit, Resolved, resolve
from ledger.store.claim import QUEUED, RUNNING, START_ATTEMPT, ClaimQueries, attempts, requests
from ledger.store.commit import reading, transaction
from ledger.store.dialect import db_now, db_now_plus, storable, unindexed
from ledger.store.lineage import link_sources
from ledger.store.row_sets import bound_rows
from ledger.store.rows import (
    ClaimedRequest,
    Completed,
    Failed,
    Outcome,
    PausedPool,
    Recorded,
    RetryLater,
    Written,
)

jobs = Job.__table__  # type: ignore[attr-defined]
# New rows reported back for per-request events; beyond this an enqueue reports counts only,
# so memory stays flat however large the input is.
KEEP_INSERTED_MAX = 10_000
# Any request queued (due or not), in flight, or waiting in a provider batch.
# Work left for a daemon: in flight, or queued in a pool that is not paused (a spent quota: what
# waits for it is not work a daemon can do until the pause ends; `--until-idle` stops).
REQUESTS_LEFT = select(requests.c.id).where(
    or_(
        requests.c.status.in_([RUNNING, RequestStatus.SUBMITTED.value]),
        and_(requests.c.status == QUEUED, requests.c.endpoint.not_in(pool_state.PAUSED_POOLS)),
    )
)


@dataclass(frozen=True)
class NextAttempt:
    """What `begin_attempt` decided: go on with attempt `number`, or stop calling."""

    number: int | None
    active_slots: int
    ts_before_commit: float
    yielded: bool = False  # gave the slot back to the queue (pool over its learned limit)
    canceled: bool = False  # a cancel came during the back-off: the request ended here

    @property
    def freed_slot(self) -> bool:
        """This transaction freed the slot (False when the row was taken over: not ours to free)."""
        return self.yielded or self.canceled


@dataclass(frozen=True)
class CancelResult:
    canceled: int  # were waiting: canceled at once
    in_flight: int  # calls under way: each ends `canceled` when it returns, keeping its slot till then


@dataclass(frozen=True)
class EnqueueResult:
    inserted: int
    duplicates: int
    queue_depth: int  # queued requests after this enqueue
    inserted_rows: list[dict[str, Any]]  # id, key, trace of each new row; empty past KEEP_INSERTED_MAX
    cached: int = 0  # of the new rows: answered from the cache at once
    twins: int = 0  # of the new rows: waiting for an identical request in flight
    # The hits of an enqueue made in one transaction (a job's), for the caller to announce once
    # committed; an enqueue in chunks (`ledger.intake`) announces each chunk's and leaves it empty.
    hits: list[Hit] = field(default_factory=list)
    # (provider, parameter) -> how many of the new requests it was left out of (`dropped_params`).
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)


def _kind(outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        return "completed"
    if isinstance(outcome, Failed):
        return "failed"
    if outcome.pause is not None or outcome.uncounted:
        return "parked"
    return "retry_hold" if outcome.hold_slot else "retry_release"


_EXPECTED_STATUS = {
    "completed": RequestStatus.COMPLETED.value,
    "failed": RequestStatus.ERROR.value,
    "retry_hold": RUNNING,
    "retry_release": QUEUED,
    "parked": QUEUED,
}


# A group's outcomes, one row each (`_outcome_row`), as one set of rows (`bound_rows`): each
# statement below writes the whole group at once. Per-row statements (an executemany) cost SQLite a step per
# row, and every step hands the GIL to the event loop and waits to get it back: under HTTP
# load that waiting was most of a group commit's time (issue 9).
def _outcome_columns() -> list[ColumnClause[Any]]:
    return [
        column("id", BigInteger),
        column("token", BigInteger),
        column("attempt", Integer),
        column("outcome", String),
        column("status", Integer),
        column("code", String),
        column("message", Text),
        column("latency", Integer),  # the attempt's
        column("elapsed", Integer),  # the request's, over all its attempts (a final failure)
        column("delay", Float),
        column("raw", Text),
        column("tin", Integer),
        column("tout", Integer),
        column("cost", Float),
        column("why", Text),
        *answers.answer_columns(),
    ]


# Answers parsed where they were received (a request with `parse`): their derived fields, in a
# statement of their own, so a group without any pays nothing for them.
_D = bound_rows(
    "d",
    "b_derived",
    column("id", BigInteger),
    column("token", BigInteger),
    *answers.derived_columns(),
    keys="b_derived_ids",
)
_WRITE_DERIVED = (
    update(requests)
    .where(
        _D.match(requests.c.id),
        requests.c.lease_token == _D.c.token,
        unindexed(requests.c.status) == RequestStatus.COMPLETED.value,
    )
    .values(**answers.derived_values(_D.c))
)
_V = bound_rows("v", "b_rows", *_outcome_columns(), keys="b_row_ids")  # the outcomes of one kind (request rows)
_VA = bound_rows("va", "b_attempts", *_outcome_columns(), keys="b_attempt_ids")  # the whole group (attempt rows)
_v, _va = _V.c, _VA.c


def _outcome_row(o: Outcome) -> dict[str, Any]:
    """One outcome as a row of `_V`: what its attempt row and its request row get."""
    row: dict[str, Any] = {"id": o.request.id, "token": o.request.token, "attempt": o.attempt}
    if isinstance(o, Completed):
        return (
            row
            | {
                "outcome": AttemptOutcome.SUCCEEDED.value,
                "status": o.status_code,
                "latency": o.latency_ms,
                "elapsed": o.latency_ms,
                "raw": storable(o.raw_output),
                "tin": o.input_tokens,
                "tout": o.output_tokens,
                "cost": o.cost_usd,
            }
            | answers.answer_row(o.answer)
        )
    f = o.failure
    timed_out = isinstance(o, RetryLater) and f.error_code == "timeout"
    row |= {
        "outcome": (AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.FAILED).value,
        "status": f.status_code,
        "code": f.error_code,
        "message": storable(f.message),
        "latency": f.latency_ms,
    }
    if isinstance(o, Failed):
        return row | {"elapsed": o.elapsed_ms}
    return row | {"delay": o.delay_s}


# Fenced like the request row: only a `running` attempt is closed by its call's outcome. One
# a takeover already marked `lost` stays lost, so the audit keeps the takeover (issue 12).
_FINISH_ATTEMPTS = (
    update(attempts)
    .where(
        _VA.match(attempts.c.request_id),
        attempts.c.attempt == _va.attempt,
        unindexed(attempts.c.outcome) == AttemptOutcome.RUNNING.value,
    )
    .values(
        outcome=_va.outcome,
        status_code=_va.status,
        error_code=_va.code,
        error_message=_va.message,
        retry_delay_s=_va.delay,
        latency_ms=_va.latency,
        finished_at=db_now(),
    )
)


def _fenced_update(*, canceling: bool = False) -> Any:
    """UPDATE of the rows these leases still hold: same token, still `running`.

    Live rows (no cancel waiting) get the outcome as reported; rows whose cancel
    is waiting for this call (`canceling=True`) end `canceled` instead.
    """
    c = requests.c
    waiting = c.cancel_requested_at.is_not(None) if canceling else c.cancel_requested_at.is_(None)
    # Reached by primary key from each outcome: `status` unindexed, or SQLite's planner scans the
    # in-flight index and probes the group for every running row (3 ms a group of 40, not 0.5).
    return update(requests).where(_V.match(c.id), c.lease_token == _v.token, unindexed(c.status) == RUNNING, waiting)


_RUNNING_UNMARKED = and_(requests.c.status == RUNNING, requests.c.cancel_requested_at.is_(None))
_FENCE_STATE = select(requests.c.id, requests.c.lease_token, requests.c.status, requests.c.cancel_requested_at).where(
    requests.c.id.in_(bindparam("b_ids", expanding=True))
)
# A final outcome settles the budget: the reservation goes, the real cost (if any) stays.
_FINAL = {
    "completed_at": db_now(),
    "lease_owner": None,
    "lease_expires_at": None,
    "reserved_usd": None,
    "updated_at": db_now(),
}
_RETRY = {
    "next_attempt_at": db_now_plus(_v.delay),
    "last_status_code": _v.status,
    "error_code": _v.code,
    "error_message": _v.message,
    "updated_at": db_now(),
}
_OUTPUT: dict[str, Any] = {
    "raw_output": _v.raw,
    "input_tokens": _v.tin,
    "output_tokens": _v.tout,
    "cost_usd": _v.cost,
    "latency_ms": _v.latency,
    "last_status_code": _v.status,
    **answers.answer_values(_v),
}
_REQUEST_UPDATES = {
    "completed": _fenced_update().values(
        status=RequestStatus.COMPLETED.value,
        error_code=None,
        error_message=None,
        answered_via=AnsweredVia.ONLINE.value,
        **_OUTPUT,
        **_FINAL,
    ),
    "failed": _fenced_update().values(
        status=RequestStatus.ERROR.value,
        error_code=_v.code,
        error_message=_v.message,
        last_status_code=_v.status,
        latency_ms=_v.elapsed,
        **_FINAL,
    ),
    "retry_hold": _fenced_update().values(**_RETRY),
    "retry_release": _fenced_update().values(
        status=QUEUED, lease_owner=None, lease_expires_at=None, reserved_usd=None, **_RETRY
    ),
    # A spent quota, or a 429 the ledger waits out: back to the queue, the attempt not counted
    # against the retry limit (`parked`).
    "parked": _fenced_update().values(
        status=QUEUED,
        lease_owner=None,
        lease_expires_at=None,
        reserved_usd=None,
        parked=requests.c.parked + 1,
        **_RETRY,
    ),
}
# The same, closing the group's attempts in the same statement where the database can (PostgreSQL:
# a data-modifying CTE; a round trip fewer per group commit).
_WITH_ATTEMPTS = {kind: stmt.add_cte(_FINISH_ATTEMPTS.cte("finished")) for kind, stmt in _REQUEST_UPDATES.items()}
# A cancel was waiting for this call: the request ends `canceled`, and what the call
# returned is kept beside it (it was paid for), never presented as `completed`.
_CANCELED_IN_FLIGHT: dict[str, Any] = {
    "status": RequestStatus.CANCELED.value,
    "error_code": "canceled",
    "error_message": func.coalesce(_v.why, "canceled while a call was in flight"),
    **_FINAL,
}
_CANCEL_UPDATES = {
    "completed": _fenced_update(canceling=True).values(**_OUTPUT, **_CANCELED_IN_FLIGHT),
    # A failed call, or none (a cancel seen after a back-off): the last status the provider gave stays.
    "other": _fenced_update(canceling=True).values(
        last_status_code=func.coalesce(_v.status, requests.c.last_status_code), **_CANCELED_IN_FLIGHT
    ),
}


def max_fair_seq(conn: Connection, job_id: str | None) -> int:
    """The highest `fair_seq` of a job's requests (of those without a job, for None); 0 for none."""
    where = requests.c.job_id.is_(None) if job_id is None else requests.c.job_id == job_id
    return int(conn.execute(select(func.coalesce(func.max(requests.c.fair_seq), 0)).where(where)).scalar_one())


def queued_count(conn: Connection) -> int:
    """Requests waiting in the queue: the depth an enqueue reports."""
    return int(conn.execute(select(func.count()).select_from(requests).where(requests.c.status == QUEUED)).scalar_one())


class QueueQueries(ClaimQueries):
    """Mixed into `Store`; needs `engine` and `dialect`."""

    # -- enqueue ---------------------------------------------------------------

    def enqueue(self, rows: Iterable[dict[str, Any]], batch_size: int = 1000) -> EnqueueResult:
        """Insert rows idempotently, all or nothing.

        `rows` may be a lazy iterator that raises half-way (a bad line): the whole
        transaction rolls back, so nothing is half written. Rows are inserted in
        batches so memory stays bounded whatever the size of the input.
        """
        with transaction(self.engine, self.dialect) as conn:
            return self.enqueue_in(conn, rows, batch_size)

    def enqueue_in(
        self,
        conn: Connection,
        rows: Iterable[dict[str, Any]],
        batch_size: int = 1000,
        cache: CachePolicy | None = None,
    ) -> EnqueueResult:
        """`enqueue` inside a transaction the caller holds (a job staged with its requests); with
        a `cache` policy, new rows are answered from the response cache where they can be."""
        kept: list[dict[str, Any]] = []
        inserted = seen = 0
        resolved: list[Resolved] = []
        next_seq: dict[str | None, int] = {}
        batch: list[dict[str, Any]] = []
        for row in rows:
            job_id = row.get("job_id")
            if job_id not in next_seq:
                next_seq[job_id] = max_fair_seq(conn, job_id) + 1
                if job_id is not None:
                    conn.execute(self.dialect.insert_ignore(jobs, ["id"]), {"id": job_id, "status": "running"})
            batch.append({**row, "fair_seq": next_seq[job_id]})
            next_seq[job_id] += 1
            if len(batch) >= batch_size:
                new = self._insert_batch(conn, batch)
                resolved.append(resolve(conn, self.dialect, [r["id"] for r in new], cache))
                seen, inserted, batch = seen + len(batch), inserted + len(new), []
                kept = kept + new if len(kept) + len(new) <= KEEP_INSERTED_MAX else []
        if batch:
            new = self._insert_batch(conn, batch)
            resolved.append(resolve(conn, self.dialect, [r["id"] for r in new], cache))
            seen, inserted = seen + len(batch), inserted + len(new)
            kept = kept + new if len(kept) + len(new) <= KEEP_INSERTED_MAX else []
        return EnqueueResult(
            inserted,
            seen - inserted,
            queued_count(conn),
            kept if len(kept) == inserted else [],
            cached=sum(len(r.hits) for r in resolved),
            twins=sum(r.twins for r in resolved),
            hits=[hit for r in resolved for hit in r.hits],
        )

    def id_for_key(self, idempotency_key: str) -> int:
        with reading(self.engine) as conn:
            return int(
                conn.execute(select(requests.c.id).where(requests.c.idempotency_key == idempotency_key)).scalar_one()
            )

    def _insert_batch(self, conn: Connection, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        stmt = (
            self.dialect.insert_ignore(requests, ["idempotency_key"])
            .values(created_at=db_now(), updated_at=db_now(), next_attempt_at=db_now())
            .returning(requests.c.id, requests.c.idempotency_key, requests.c.trace)
        )
        new = [dict(r._mapping) for r in conn.execute(stmt, batch)]
        sources = {row["idempotency_key"]: row.get("sources") for row in batch if row.get("sources")}
        if sources:
            link_sources(conn, ((row["id"], sources.get(row["idempotency_key"])) for row in new))
        return new

    # -- record ----------------------------------------------------------------

    def record(self, outcomes: list[Outcome], claim_for: str | None = None, **limits: Any) -> Recorded:
        """Write a group of outcomes in one transaction (group commit), set-based.

        One statement per kind of change, the whole group as one JSON parameter; when
        every fenced update matched its row (the usual case) nothing more is read.
        Otherwise each outcome is sorted out: a row whose cancel was waiting for this
        call ends `canceled`, a row taken over by another lease is left alone (`REFUSED`). The timestamp taken
        just before the commit is returned so that `released` events are stamped
        no later than the slots really became free.

        With `claim_for` (a worker id) the slots freed here are claimed again in
        the same transaction: one commit per round instead of two. The claim lock
        is taken *first*, as by every multi-row writer: taken after the row locks,
        it would deadlock with a claimer that holds it and waits for those rows.
        """
        rows = [_outcome_row(o) for o in outcomes]
        endpoints = {o.request.endpoint for o in outcomes}
        group = _VA.rows(rows)
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for o, row in zip(outcomes, rows, strict=True):
            by_kind.setdefault(_kind(o), []).append(row)
        updates: list[tuple[Any, dict[str, Any]]] = []
        for i, (kind, of_kind) in enumerate(by_kind.items()):
            params = _V.bind(group if len(of_kind) == len(rows) else of_kind)
            if i == 0:  # the group's attempts are closed with the first kind's requests
                both = self.dialect.as_one(_WITH_ATTEMPTS[kind], (_FINISH_ATTEMPTS, _REQUEST_UPDATES[kind]))
                params |= _VA.bind(group)
                updates += [(stmt, params) for stmt in both]
            else:
                updates.append((_REQUEST_UPDATES[kind], params))
        # The claim's reads go with the group's writes when nothing else is written before the
        # claim (no lease sweep, nothing to note about the pools): the usual group.
        reads = None
        quiet = pool_state.quiet(outcomes, self.pool_rules, self.windowed)
        if claim_for and quiet and not limits.get("reclaim", True) and not self.learning & endpoints:
            freed = sum(len(of_kind) for kind, of_kind in by_kind.items() if kind != "retry_hold")
            reads = self.claim_reads(claim_for, limits["lease_seconds"], freed)
        # Then the twins of the requests this group ended (response cache): answered from them,
        # or released when they ended without a source's answer.
        ended = ENDED.bind([{"id": o.request.id} for o in outcomes])
        twins = [(TWINS_ANSWERED, ended), (TWINS_RELEASED, ended)]
        with transaction(self.engine, self.dialect) as conn:
            # The lock, the group's updates and the claim's reads: one round trip on PostgreSQL.
            results = self.dialect.serialize_claimers(conn, *updates, *twins, *(reads.statements if reads else ()))
            wrote, read_ahead = results[: len(updates)], results[len(updates) + len(twins) :]
            answered_twins = [(int(i), int(c)) for i, c in results[len(updates)].rows]
            counted = [r for (stmt, _), r in zip(updates, wrote, strict=True) if stmt is not _FINISH_ATTEMPTS]
            matched = sum(r.rowcount for r in counted)
            # Every fenced update matched its row (the usual case): nothing more to read.
            if matched != len(outcomes):
                written = self._sort_out(conn, outcomes)  # which may end rows `canceled`: read after it
                reads = None
            else:
                written = [Written.APPLIED] * len(outcomes)
            parsed = [
                answers.derived_row(o.request.id, o.derived, token=o.request.token)
                for o, w in zip(outcomes, written, strict=True)
                if w is Written.APPLIED and isinstance(o, Completed) and o.derived is not None
            ]
            if parsed:
                self.dialect.execute(conn, _WRITE_DERIVED, _D.bind(parsed))
            paused: list[PausedPool] = []
            if not quiet:
                for window in pool_state.note_outcomes(conn, self.dialect, outcomes, self.pool_rules, self.windowed):
                    self.pool_rules = self.pool_rules.learned(window)
                paused = pool_state.pause_pools(conn, self.dialect, outcomes)
            # Answers per pool: they count towards probing a learned limit up, and they prove a
            # pool's peak in slow start (the slots they freed were busy until now).
            answered = Counter(
                o.request.endpoint
                for o, w in zip(outcomes, written, strict=True)
                if w is Written.APPLIED and isinstance(o, Completed)
            )
            learning = {endpoint: n for endpoint, n in answered.items() if endpoint in self.learning}
            if learning:
                pool_state.note_successes(conn, learning, self.pool_probe_seconds)
            if claim_for:
                read = replace(reads, found=read_ahead) if reads else None
                claim = self._claim_in(conn, claim_for, proven=answered, read=read, **limits)
                active = claim.active_slots - len(claim.requests)
            else:
                claim, active = None, self._active(conn)
            ts = time.time()
        return Recorded(written, active, ts, claim, answered_twins, paused)

    def _sort_out(self, conn: Connection, outcomes: list[Outcome]) -> list[Written]:
        """Per outcome, after the live updates: applied, ended by a waiting cancel, or refused."""
        state = {row.id: row for row in conn.execute(_FENCE_STATE, {"b_ids": [o.request.id for o in outcomes]})}
        written = []
        for o in outcomes:
            row = state.get(o.request.id)
            if row is None or row.lease_token != o.request.token:
                written.append(Written.REFUSED)
            elif row.cancel_requested_at is None and row.status == _EXPECTED_STATUS[_kind(o)]:
                written.append(Written.APPLIED)
            elif row.status == RUNNING and row.cancel_requested_at is not None:
                stmt = _CANCEL_UPDATES["completed" if isinstance(o, Completed) else "other"]
                ended = self.dialect.execute(conn, stmt, _V.bind([_outcome_row(o)])).rowcount
                written.append(Written.CANCELED if ended else Written.REFUSED)
            else:
                written.append(Written.REFUSED)
        return written

    def _fenced(self, request: ClaimedRequest) -> Any:
        c = requests.c
        return and_(
            c.id == request.id, c.lease_token == request.token, c.status == RUNNING, c.cancel_requested_at.is_(None)
        )

    def begin_attempt(self, request: ClaimedRequest) -> NextAttempt:
        """After a held back-off: count the next attempt durably before making it.

        The slot is given back instead (`yielded`) when the pool is now over its
        learned limit, or its RPM/TPM window is full: requests that waited out a 429 must not all retry at once
        into an endpoint that has just shown it serves fewer. A cancel that came
        during the back-off ends the request here (`canceled`). `number` is None
        in those cases, and when the row is no longer ours (taken over while we slept).
        """
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            rules = self.pool_rules
            if pool_state.over_learned_limit(conn, request.endpoint) or pool_state.window_full(
                conn, request.endpoint, rules
            ):
                if self._give_back(conn, request):
                    return NextAttempt(None, self._active(conn), time.time(), yielded=True)
            else:
                number = self._count_attempt(conn, request)
                if number is not None:
                    pool_state.held_call_started(conn, request, number, rules)
                    return NextAttempt(number, 0, 0.0)
            # Not live under this lease any more: a cancel waiting for it ends it here, else it was taken over.
            why = {"id": request.id, "token": request.token, "why": "canceled during a back-off between attempts"}
            ended = self.dialect.execute(conn, _CANCEL_UPDATES["other"], _V.bind([why])).rowcount
            return NextAttempt(None, self._active(conn), time.time(), canceled=bool(ended))

    def rate_limited_for(self, request_id: int, attempt: int, seconds: float) -> bool:
        """Whether the request's attempts before `attempt` have been refused with 429s, one after
        another, since at least `seconds` ago: how long a rate limit has kept it from an answer."""
        with self.engine.connect() as conn:
            return pool_windows.refused_since(conn, request_id, attempt, seconds)

    def _give_back(self, conn: Connection, request: ClaimedRequest) -> bool:
        """Back to the queue, due now, slot freed."""
        gave_back = conn.execute(
            update(requests)
            .where(self._fenced(request))
            .values(
                status=QUEUED,
                lease_owner=None,
                lease_expires_at=None,
                reserved_usd=None,
                next_attempt_at=db_now(),
                updated_at=db_now(),
            )
        ).rowcount
        return bool(gave_back)

    def _count_attempt(self, conn: Connection, request: ClaimedRequest) -> int | None:
        """The next attempt's number, counted on the request and opened as an attempt row."""
        c = requests.c
        row = conn.execute(
            update(requests)
            .where(self._fenced(request))
            .values(attempts=c.attempts + 1, updated_at=db_now())
            .returning(c.attempts, c.lease_owner)
        ).first()
        if row is None:
            return None
        opened = {"request_id": request.id, "attempt": row.attempts, "worker": row.lease_owner}
        conn.execute(START_ATTEMPT, {**opened, "outcome": AttemptOutcome.RUNNING.value})
        return int(row.attempts)

    def cancel(self, *, ids: list[int] | None = None, job_id: str | None = None) -> CancelResult:
        """Cancel requests that are not final yet.

        A request waiting in the queue ends `canceled` at once. One whose call is
        in flight keeps its slot (the provider is still working on it, and a slot
        freed now would let another call start beside it): it is marked, and ends
        `canceled` when its call returns or its lease expires.

        One UPDATE decides both per row. Two (waiting rows, then running ones) would
        miss a row that went from running back to the queue between them.
        """
        c = requests.c
        where = [or_(c.status.in_([QUEUED, RequestStatus.SUBMITTED.value]), _RUNNING_UNMARKED)]
        if ids is not None:
            where.append(c.id.in_(ids))
        if job_id is not None:
            where.append(c.job_id == job_id)
        in_flight = c.status == RUNNING
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # the lock order of every multi-row writer (docs)
            ended = conn.execute(
                update(requests)
                .where(*where)
                .values(
                    status=case((in_flight, c.status), else_=RequestStatus.CANCELED.value),
                    cancel_requested_at=func.coalesce(c.cancel_requested_at, db_now()),
                    lease_owner=case((in_flight, c.lease_owner), else_=None),
                    lease_expires_at=case((in_flight, c.lease_expires_at), else_=None),
                    completed_at=case((in_flight, c.completed_at), else_=db_now()),
                    updated_at=db_now(),
                )
                .returning(c.status)
            ).scalars()
            statuses = list(ended)
        marked = statuses.count(RUNNING)
        return CancelResult(len(statuses) - marked, marked)

    def resume_pool(self, endpoint: str) -> bool:
        """Lift a pool's pause (a spent quota) at once; False when it was not paused."""
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)
            return pool_state.resume_pool(conn, endpoint)

    def online_providers(self) -> set[str]:
        """Providers with online work waiting: the adapters a starting daemon should build first."""
        with reading(self.engine) as conn:
            return set(conn.execute(self._online_work(requests.c.provider).distinct()).scalars())

    @staticmethod
    def _online_work(column: Any) -> Any:
        c = requests.c
        return select(column).where(c.delivery == Delivery.ONLINE.value, c.status.in_([QUEUED, RUNNING]))
