"""Provider batch results' SQL: a chunk of result lines written back to its requests, and a
batch's end (what it left unanswered), set-based.

Every write is fenced twice: by the batch's lease (`_fence`: a step whose lease was taken
over changes nothing) and row by row (a request is written only while still `submitted` in
that very batch, its attempt only while still `running`), so mapping the same lines twice (a
crash mid-mapping, then a restart) changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
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
from sqlalchemy.engine import Connection, Engine

from ledger.statuses import AnsweredVia, AttemptOutcome, RequestStatus
from ledger.store import answers
from ledger.store.batches import SUBMITTED, BatchLease, _fence, _in_batch, _status
from ledger.store.cache import ANY_TWIN, ENDED, TWINS_ANSWERED, TWINS_RELEASED
from ledger.store.claim import QUEUED
from ledger.store.commit import transaction
from ledger.store.deadlines import ANSWERED_LATE, FALLBACK, detach
from ledger.store.dialect import Dialect, db_now, db_now_plus, storable, unindexed
from ledger.store.row_sets import bound_rows
from ledger.store.tables import attempts, batches, requests

_r, _b, _a = requests.c, batches.c, attempts.c
_CHUNK = 1000  # lines per set of statements when ending a batch's unanswered requests


@dataclass(slots=True)  # not frozen: built per mapped line, and a frozen __init__ costs three times as much
class LineOutcome:
    """One result line, ready to write: `kind` succeeded | failed | expired | canceled."""

    request_id: int
    kind: str
    answer: Any = None  # succeeded: the answer whole (`adapters.base.CallResult`)
    cost_usd: float | None = None
    status_code: int | None = None
    error_code: str | None = None
    message: str | None = None
    retryable: bool = False
    derived: dict[str, Any] | None = None  # succeeded, and the request has a `parse`: its fields


@dataclass
class Mapped:
    """What mapping a chunk of result lines did."""

    completed: int = 0
    failed: int = 0  # ended `error`
    retried: int = 0  # back to the queue after a retryable failure (counted)
    requeued: int = 0  # back to the queue, not reached by the provider (not counted)
    canceled: int = 0  # unanswered by a batch canceled through the ledger
    online: int = 0  # `auto`, unanswered by a batch canceled at a deadline: gone online
    kept: int = 0  # already mapped, canceled, or not in this batch: nothing changed
    # Twins these requests' answers answered (request id, cached_from): response cache hits.
    cache_hits: list[tuple[int, int]] = field(default_factory=list)

    def add(self, other: Mapped) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def lines(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "cache_hits")


# A chunk's result lines, as a table each (`bound_rows`): one set-based statement per
# kind of write, not one statement per line.
_SUCCEEDED = bound_rows(
    "v",
    "b_rows",
    column("id", BigInteger),
    column("raw", Text),
    column("tin", Integer),
    column("tout", Integer),
    column("cost", Float),
    *answers.answer_columns(),
)
_FAILED = bound_rows(
    "v",
    "b_rows",
    column("id", BigInteger),
    column("status", String),
    column("delay", Float),
    column("code", String),
    column("message", Text),
    column("status_code", Integer),
)
_ENDED = bound_rows(
    "v",
    "b_rows",
    column("id", BigInteger),
    column("outcome", String),
    column("status_code", Integer),
    column("code", String),
    column("message", Text),
    column("delay", Float),
)
_v_ok, _v_fail, _v_end = _SUCCEEDED.c, _FAILED.c, _ENDED.c
_PARSED = bound_rows("d", "b_derived", column("id", BigInteger), *answers.derived_columns())
# A parsed answer's fields, on the rows this chunk completed (still in this batch).
_MAP_DERIVED = (
    update(requests)
    .where(_r.id == _PARSED.c.id, _in_batch, _status == RequestStatus.COMPLETED.value)
    .values(**answers.derived_values(_PARSED.c))
)

_MAP_SUCCEEDED = (
    update(requests)
    .where(
        _r.id == _v_ok.id,
        _in_batch,
        # Still waiting for this batch; or canceled meanwhile and still without the answer it paid for.
        or_(_status == SUBMITTED, and_(_status == RequestStatus.CANCELED.value, _r.raw_output.is_(None))),
    )
    .values(
        status=case((_r.status == SUBMITTED, RequestStatus.COMPLETED.value), else_=_r.status),
        raw_output=_v_ok.raw,
        input_tokens=_v_ok.tin,
        output_tokens=_v_ok.tout,
        cost_usd=_v_ok.cost,
        **answers.answer_values(_v_ok),
        reserved_usd=None,
        last_status_code=200,
        answered_via=AnsweredVia.BATCH.value,
        error_code=case((_r.status == SUBMITTED, None), else_=_r.error_code),
        error_message=case((_r.status == SUBMITTED, None), else_=_r.error_message),
        completed_at=func.coalesce(_r.completed_at, db_now()),
        updated_at=db_now(),
    )
)
_MAP_FAILED = (
    update(requests)
    .where(_r.id == _v_fail.id, _in_batch, _status == SUBMITTED)
    .values(
        status=_v_fail.status,
        next_attempt_at=db_now_plus(_v_fail.delay),
        error_code=_v_fail.code,
        error_message=_v_fail.message,
        last_status_code=_v_fail.status_code,
        reserved_usd=None,
        completed_at=case((_v_fail.status == QUEUED, None), else_=db_now()),
        updated_at=db_now(),
    )
    .returning(_r.status)  # retried (back to the queue) and failed are counted apart
)
_CLOSE_ATTEMPTS = (
    update(attempts)
    .where(
        _a.request_id == _v_end.id,
        # Checks on the attempt each row reaches by its request: hidden from the planner, which
        # for a set of some hundred rows as VALUES would rather build an automatic index of
        # every attempt on (request_id, batch_id, outcome), each time, than use the unique one.
        unindexed(_a.batch_id) == bindparam("b_batch"),
        unindexed(_a.outcome) == AttemptOutcome.RUNNING.value,
    )
    .values(
        outcome=_v_end.outcome,
        status_code=_v_end.status_code,
        error_code=_v_end.code,
        error_message=_v_end.message,
        retry_delay_s=_v_end.delay,
        finished_at=db_now(),
    )
)
# A batch answer to a request that had gone online at its deadline (`deadlines.detach`): its cost
# kept on the batch attempt, never a second result.
_LATE_ANSWERS = (
    update(attempts)
    .where(
        _a.request_id == _v_ok.id,
        unindexed(_a.batch_id) == bindparam("b_batch"),
        unindexed(_a.error_code) == FALLBACK,
    )
    .values(
        outcome=AttemptOutcome.SUCCEEDED.value,
        status_code=200,
        error_code=ANSWERED_LATE,
        error_message="answered by its batch after it had gone online: paid for, not its result",
        cost_usd=_v_ok.cost,
    )
)
_ATTEMPT_OUTCOME = {
    "succeeded": AttemptOutcome.SUCCEEDED.value,
    "failed": AttemptOutcome.FAILED.value,
    "expired": AttemptOutcome.EXPIRED.value,
    "canceled": AttemptOutcome.CANCELED.value,
}


class BatchResultQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    def map_lines(
        self, lease: BatchLease, lines: Sequence[LineOutcome], max_attempts: int, delay_for: Callable[[int], float]
    ) -> Mapped:
        """Write a chunk of result lines in one transaction, set-based.

        succeeded: `completed` with raw output, usage and cost (a request canceled while its
        batch ran keeps `canceled` and gets the output it paid for); failed: retried in a
        later batch while the request's failed attempts stay under `max_attempts` and the
        error is retryable, else `error`; expired / canceled: back to the queue, not counted.
        """
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # a writer of many rows: the ledger's turn alone
            _fence(conn, lease)
            return _map_in(conn, self.dialect, lease.id, lines, max_attempts, delay_for)

    def finish_batch(
        self,
        lease: BatchLease,
        status: str,
        *,
        error: str | None = None,
        rejected: dict[int, str] | None = None,
        count_failure: str | None = None,
        max_attempts: int = 3,
        delay_for: Callable[[int], float] = lambda n: 0.0,
    ) -> Mapped:
        """The batch is over. Its requests that got no result line end one way each:
        a cancel asked of the ledger → `canceled`; named by the provider's validation
        errors (`rejected`: request id → reason) → `error`; `count_failure` (a reason: the
        batch failed as a whole) → a failed attempt, retried by the policy; otherwise (an
        expired or canceled batch) → back to the queue, not counted. Then the batch ends
        `status`, its lease let go."""
        mapped = Mapped()
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # a writer of many rows: the ledger's turn alone
            row = _fence(conn, lease)
            if row.fallback_at is not None and row.cancel_requested_at is None:
                mapped.online = sum(detach(conn, lease.id).values())
            left = list(conn.execute(select(_r.id).where(_r.batch_id == lease.id, _r.status == SUBMITTED)).scalars())
            if row.cancel_requested_at is not None:
                mapped.canceled = _end_canceled(conn, lease.id, left)
                _settle_twins(conn, self.dialect, left)
            else:
                lines = [_unanswered(i, rejected or {}, count_failure, error) for i in left]
                for start in range(0, len(lines), _CHUNK):
                    chunk = lines[start : start + _CHUNK]
                    mapped.add(_map_in(conn, self.dialect, lease.id, chunk, max_attempts, delay_for))
            conn.execute(
                update(batches)
                .where(_b.id == lease.id)
                .values(
                    status=status,
                    error=error,
                    completed_at=db_now(),
                    lease_owner=None,
                    lease_expires_at=None,
                    updated_at=db_now(),
                )
            )
        return mapped


def _unanswered(request_id: int, rejected: dict[int, str], count_failure: str | None, why: str | None) -> LineOutcome:
    """How a request its ended batch did not answer is written (see `finish_batch`)."""
    if request_id in rejected:
        return LineOutcome(
            request_id, "failed", status_code=400, error_code="invalid_request", message=rejected[request_id]
        )
    if count_failure is not None:
        return LineOutcome(request_id, "failed", error_code="batch_failed", message=count_failure, retryable=True)
    return LineOutcome(request_id, "expired", error_code="batch_ended", message=why)


def _map_in(
    conn: Connection,
    dialect: Dialect,
    batch_id: int,
    lines: Sequence[LineOutcome],
    max_attempts: int,
    delay_for: Callable[[int], float],
) -> Mapped:
    """The writes of `map_lines`, inside a transaction that holds the lock and the batch's lease."""
    mapped = Mapped()
    failed_before = _failed_attempts(conn, [x.request_id for x in lines if x.kind == "failed"])
    succeeded: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    ended: list[dict[str, Any]] = []
    for x in lines:
        delay = None
        if x.kind == "succeeded":
            answer = x.answer
            succeeded.append(
                {
                    "id": x.request_id,
                    "raw": storable(answer.text),
                    "tin": answer.input_tokens,
                    "tout": answer.output_tokens,
                    "cost": x.cost_usd,
                }
                | answers.answer_row(answer)
            )
        elif x.kind == "failed":
            number = failed_before.get(x.request_id, 0) + 1
            retry = x.retryable and number < max_attempts
            delay = delay_for(number) if retry else 0.0
            failed.append(
                {
                    "id": x.request_id,
                    "status": QUEUED if retry else RequestStatus.ERROR.value,
                    "delay": delay,
                    "code": x.error_code,
                    "message": storable(x.message),
                    "status_code": x.status_code,
                }
            )
        ended.append(
            {
                "id": x.request_id,
                "outcome": _ATTEMPT_OUTCOME[x.kind],
                "status_code": x.status_code,
                "code": x.error_code,
                "message": storable(x.message),
                "delay": delay,
            }
        )
    if succeeded:
        params = {**_SUCCEEDED.bind(succeeded), "b_batch": batch_id}
        mapped.completed = dialect.execute_by_rows(conn, _MAP_SUCCEEDED, params).rowcount
        if mapped.completed < len(succeeded):  # some went online at their deadline, or were written before
            dialect.execute_by_rows(conn, _LATE_ANSWERS, params)
    parsed = [answers.derived_row(x.request_id, x.derived) for x in lines if x.kind == "succeeded" and x.derived]
    if parsed:
        dialect.execute_by_rows(conn, _MAP_DERIVED, {**_PARSED.bind(parsed), "b_batch": batch_id})
    if failed:
        params = {**_FAILED.bind(failed), "b_batch": batch_id}
        statuses = [status for (status,) in dialect.execute_by_rows(conn, _MAP_FAILED, params)]
        mapped.retried = statuses.count(QUEUED)
        mapped.failed = len(statuses) - mapped.retried
    if ended:
        dialect.execute_by_rows(conn, _CLOSE_ATTEMPTS, {**_ENDED.bind(ended), "b_batch": batch_id})
    mapped.requeued = _requeue(conn, batch_id, [x.request_id for x in lines if x.kind in ("expired", "canceled")])
    mapped.kept = len(lines) - mapped.completed - mapped.failed - mapped.retried - mapped.requeued
    mapped.cache_hits = _settle_twins(conn, dialect, [x.request_id for x in lines])
    return mapped


def _settle_twins(conn: Connection, dialect: Dialect, ids: list[int]) -> list[tuple[int, int]]:
    """The twins of these requests (response cache): answered from them, or released. Nothing to
    do when no request waits for a twin (the usual case: a tenth of a chunk's time went to finding
    none). One that starts waiting after this probe, from an enqueue racing the mapping, is settled
    by the lease sweep (`sweep_twins`), as when it races the statements themselves."""
    if conn.execute(ANY_TWIN).first() is None:
        return []
    ended = ENDED.bind([{"id": i} for i in ids])
    answered = [(int(i), int(c)) for i, c in dialect.execute(conn, TWINS_ANSWERED, ended)]
    dialect.execute(conn, TWINS_RELEASED, ended)
    return answered


def _failed_attempts(conn: Connection, ids: list[int]) -> dict[int, int]:
    """Failed attempts per request so far: what RETRY_MAX_ATTEMPTS counts for batch requests."""
    if not ids:
        return {}
    rows = conn.execute(
        select(_a.request_id, func.count())
        .where(_a.request_id.in_(ids), _a.outcome == AttemptOutcome.FAILED.value)
        .group_by(_a.request_id)
    )
    return {int(rid): int(n) for rid, n in rows}


def _requeue(conn: Connection, batch_id: int, ids: list[int]) -> int:
    """Requests the provider never reached go back to the queue, due now, for a later batch."""
    if not ids:
        return 0
    return int(
        conn.execute(
            update(requests)
            .where(_r.id.in_(ids), _r.batch_id == batch_id, _r.status == SUBMITTED)
            .values(status=QUEUED, next_attempt_at=db_now(), updated_at=db_now())
        ).rowcount
    )


def _end_canceled(conn: Connection, batch_id: int, ids: list[int]) -> int:
    """A batch canceled by the ledger: what it did not answer ends `canceled`."""
    if not ids:
        return 0
    conn.execute(
        update(attempts)
        .where(_a.request_id.in_(ids), _a.batch_id == batch_id, _a.outcome == AttemptOutcome.RUNNING.value)
        .values(outcome=AttemptOutcome.CANCELED.value, error_code="batch_canceled", finished_at=db_now())
    )
    return int(
        conn.execute(
            update(requests)
            .where(_r.id.in_(ids), _r.batch_id == batch_id, _r.status == SUBMITTED)
            .values(
                status=RequestStatus.CANCELED.value,
                error_code="canceled",
                error_message="canceled with its provider batch",
                completed_at=db_now(),
                updated_at=db_now(),
            )
        ).rowcount
    )
