"""Provider batch jobs' SQL: grouping, attaching requests, batch leases, mapping results back.

Invariants every statement here keeps:
- A batch row is leased like a request (`lease_owner`, `lease_token`): every write a
  step makes to a batch (and, through it, to its requests) is fenced by the token,
  so two daemons never submit or map the same batch, and one whose lease was taken
  over changes nothing (`BatchLeaseLost`).
- A request is attached to a batch (status `submitted`, `batch_id`, its attempt row
  opened and counted) in the transaction that makes the batch `submitting`, before
  any provider call; its result is written only while it is still `submitted` in
  that very batch, and its attempt only while still `running`: mapping a result
  twice (a crash mid-mapping, then a restart) changes nothing the second time.
- Transactions that update many request rows take the claim lock first (the lock
  order of every multi-row writer, docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
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
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine

from ledger.models import AttemptOutcome, BatchStatus, Delivery, LlmBatch, RequestStatus
from ledger.store.claim import QUEUED, Budget, attempts, requests
from ledger.store.commit import transaction
from ledger.store.dialect import Dialect, db_now, db_now_plus, json_param, json_rows, unindexed

batches = LlmBatch.__table__  # type: ignore[attr-defined]
_r, _b, _a = requests.c, batches.c, attempts.c

SUBMITTED = RequestStatus.SUBMITTED.value
BATCH = Delivery.BATCH.value
OPEN_BATCH = (BatchStatus.QUEUED.value, BatchStatus.SUBMITTING.value, BatchStatus.SUBMITTED.value)
_CHUNK = 1000  # lines per set of statements when ending a batch's unanswered requests
_ATTACH_CHUNK = 10_000  # requests per attaching statement


class BatchLeaseLost(RuntimeError):
    """The batch is no longer this worker's (its lease expired and another daemon took it)."""


@dataclass(frozen=True)
class BatchGroup:
    """Queued batch requests that may share one provider batch."""

    provider: str
    model: str
    batch_key: str | None
    job_id: str | None
    queued: int
    waited: bool  # the oldest has waited LEDGER_PROVIDER_BATCH_WAIT


@dataclass(frozen=True)
class BatchLease:
    id: int
    token: int
    worker: str


@dataclass(frozen=True)
class LineOutcome:
    """One result line, ready to write: `kind` succeeded | failed | expired | canceled."""

    request_id: int
    kind: str
    text: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    status_code: int | None = None
    error_code: str | None = None
    message: str | None = None
    retryable: bool = False


@dataclass
class Mapped:
    """What mapping a chunk of result lines did."""

    completed: int = 0
    failed: int = 0  # ended `error`
    retried: int = 0  # back to the queue after a retryable failure (counted)
    requeued: int = 0  # back to the queue, not reached by the provider (not counted)
    canceled: int = 0  # unanswered by a batch canceled through the ledger
    kept: int = 0  # already mapped, canceled, or not in this batch: nothing changed

    def add(self, other: Mapped) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def lines(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))


_FENCE = update(batches).where(
    _b.id == bindparam("b_batch"), _b.lease_token == bindparam("b_token"), _b.lease_owner == bindparam("b_worker")
)
# A chunk's result lines, one JSON parameter each (`json_rows`): one set-based statement per
# kind of write, not one statement per line.
_SUCCEEDED = json_rows(
    "v",
    "b_rows",
    column("id", BigInteger),
    column("raw", Text),
    column("tin", Integer),
    column("tout", Integer),
    column("cost", Float),
)
_FAILED = json_rows(
    "v",
    "b_rows",
    column("id", BigInteger),
    column("status", String),
    column("delay", Float),
    column("code", String),
    column("message", Text),
    column("status_code", Integer),
)
_ENDED = json_rows(
    "v",
    "b_rows",
    column("id", BigInteger),
    column("outcome", String),
    column("status_code", Integer),
    column("code", String),
    column("message", Text),
    column("delay", Float),
)
_ATTACHED = json_rows("v", "b_rows", column("id", BigInteger))
_v_ok, _v_fail, _v_end = _SUCCEEDED.c, _FAILED.c, _ENDED.c
# Rows are reached by id from the chunk; these checks are made on each (`unindexed`).
_in_batch, _status = unindexed(_r.batch_id) == bindparam("b_batch"), unindexed(_r.status)

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
        reserved_usd=None,
        last_status_code=200,
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
        _a.batch_id == bindparam("b_batch"),
        _a.outcome == AttemptOutcome.RUNNING.value,
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
_ATTACH = (
    update(requests)
    .where(_r.id == _ATTACHED.c.id, _status == QUEUED, unindexed(_r.delivery) == BATCH)
    .values(
        status=SUBMITTED,
        batch_id=bindparam("b_batch"),
        attempts=_r.attempts + 1,
        reserved_usd=_r.estimate_usd,  # budgets: held until the batch's result settles it
        updated_at=db_now(),
    )
)
# The attempts of the requests attached in this transaction: a batch is attached once (it leaves
# `queued` in that same transaction), so its submitted requests are exactly these.
_OPEN_ATTEMPTS = (
    insert(attempts)
    .from_select(
        ["request_id", "attempt", "batch_id", "worker", "outcome", "started_at"],
        select(
            _r.id,
            _r.attempts,
            _r.batch_id,
            bindparam("b_worker", type_=String),
            literal(AttemptOutcome.RUNNING.value),
            db_now(),
        ).where(_r.batch_id == bindparam("b_batch"), _r.status == SUBMITTED),
    )
    .returning(_a.request_id)
)
_ATTEMPT_OUTCOME = {
    "succeeded": AttemptOutcome.SUCCEEDED.value,
    "failed": AttemptOutcome.FAILED.value,
    "expired": AttemptOutcome.EXPIRED.value,
    "canceled": AttemptOutcome.CANCELED.value,
}


class BatchQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    # -- forming batches -------------------------------------------------------

    def move_to_online(self, batch_providers: Iterable[str]) -> dict[str, int]:
        """Queued batch requests of providers without a batch API go through the online path."""
        with transaction(self.engine, self.dialect) as conn:
            rows = conn.execute(
                update(requests)
                .where(_r.status == QUEUED, _r.delivery == BATCH, _r.provider.not_in(list(batch_providers)))
                .values(delivery=Delivery.ONLINE.value, updated_at=db_now())
                .returning(_r.provider)
            ).scalars()
            moved: dict[str, int] = {}
            for provider in rows:
                moved[provider] = moved.get(provider, 0) + 1
            return moved

    def batch_groups(self, wait_seconds: float) -> list[BatchGroup]:
        """Groups of due batch requests, each with whether its oldest has waited long enough."""
        key = (_r.provider, _r.model, _r.batch_key, _r.job_id)
        query = (
            select(*key, func.count(), func.min(_r.next_attempt_at) <= db_now_plus(-wait_seconds))
            .where(_r.status == QUEUED, _r.delivery == BATCH, _r.next_attempt_at <= db_now())
            .group_by(*key)
            .order_by(func.min(_r.next_attempt_at))
        )
        with self.engine.connect() as conn:
            return [BatchGroup(p, m, k, j, int(n), bool(w)) for p, m, k, j, n, w in conn.execute(query)]

    def open_batch(self, group: BatchGroup, worker: str, lease_seconds: float, submit_key: str) -> BatchLease:
        """The batch row, leased to `worker`, before any request is attached (status `queued`)."""
        with transaction(self.engine, self.dialect) as conn:
            row = conn.execute(
                insert(batches)
                .values(
                    provider=group.provider,
                    model=group.model,
                    params_key=group.batch_key,
                    job_id=group.job_id,
                    submit_key=submit_key,
                    status=BatchStatus.QUEUED.value,
                    lease_owner=worker,
                    lease_token=1,
                    lease_expires_at=db_now_plus(lease_seconds),
                    created_at=db_now(),
                    updated_at=db_now(),
                )
                .returning(_b.id, _b.lease_token)
            ).one()
        return BatchLease(int(row.id), int(row.lease_token), worker)

    def group_request_ids(self, group: BatchGroup, limit: int) -> list[int]:
        """Due requests of a group, in claim order (priority, fairness across jobs, age)."""
        query = (
            select(_r.id)
            .where(
                _r.status == QUEUED,
                _r.delivery == BATCH,
                _r.next_attempt_at <= db_now(),
                _r.provider == group.provider,
                _r.model == group.model,
                _r.batch_key.is_(None) if group.batch_key is None else _r.batch_key == group.batch_key,
                _r.job_id.is_(None) if group.job_id is None else _r.job_id == group.job_id,
            )
            .order_by(_r.priority.desc(), _r.fair_seq, _r.id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def request_inputs(self, ids: Sequence[int]) -> list[Any]:
        """What a batch input line needs of each request, in the order of `ids`."""
        query = select(_r.id, _r.model, _r.input, _r.params, _r.response_format).where(
            _r.id.in_(bindparam("b_ids", expanding=True))
        )
        with self.engine.connect() as conn:
            found = {row.id: row for row in conn.execute(query, {"b_ids": list(ids)})}
        return [found[i] for i in ids if i in found]

    def batch_request_ids(self, batch_id: int) -> list[int]:
        """The requests attached to a batch and still waiting for it, in id order (its input's order)."""
        query = select(_r.id).where(_r.batch_id == batch_id, _r.status == SUBMITTED).order_by(_r.id)
        with self.engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def attach(
        self, lease: BatchLease, ids: Sequence[int], input_bytes: int, daily_budget: float | None = None
    ) -> list[int]:
        """Attach requests to the batch (those still queued): `submitted`, attempt counted and opened.

        Like a claim, an attach reserves each request's worst-case cost against today's
        budget and its job's, under the claim lock: requests that do not fit stay queued
        for a later batch. Returns the ids attached, in id order; the batch becomes
        `submitting`. A batch with nothing left to attach (all canceled meanwhile, or
        none affordable) is deleted.
        """
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # the lock order of every multi-row writer
            _fence(conn, lease)
            ids = _affordable(conn, ids, daily_budget)
            for start in range(0, len(ids), _ATTACH_CHUNK):
                rows = json_param({"id": i} for i in ids[start : start + _ATTACH_CHUNK])
                self.dialect.execute(conn, _ATTACH, {"b_rows": rows, "b_batch": lease.id})
            params = {"b_batch": lease.id, "b_worker": lease.worker}
            attached = [int(rid) for (rid,) in self.dialect.execute(conn, _OPEN_ATTEMPTS, params)]
            if not attached:
                conn.execute(delete(batches).where(_b.id == lease.id))
                return []
            conn.execute(
                update(batches)
                .where(_b.id == lease.id)
                .values(
                    status=BatchStatus.SUBMITTING.value,
                    request_total=len(attached),
                    input_bytes=input_bytes,
                    updated_at=db_now(),
                )
            )
        with transaction(self.engine, self.dialect) as conn:  # the mapping's plans need to know these attempts exist
            self.dialect.refresh_statistics(conn, attempts)
        return sorted(attached)

    # -- leases ----------------------------------------------------------------

    def take_batch(self, worker: str, lease_seconds: float) -> dict[str, Any] | None:
        """Lease the next batch with work due: one to (re)submit, one due for a poll, or one with
        a cancel to send. Its lease is free, expired, or already this worker's."""
        free = or_(_b.lease_owner.is_(None), _b.lease_expires_at < db_now(), _b.lease_owner == worker)
        due = or_(
            _b.status.in_([BatchStatus.QUEUED.value, BatchStatus.SUBMITTING.value]),
            and_(
                _b.status == BatchStatus.SUBMITTED.value,
                or_(
                    _b.next_poll_at.is_(None),
                    _b.next_poll_at <= db_now(),
                    and_(_b.cancel_requested_at.is_not(None), _b.cancel_sent_at.is_(None)),
                ),
            ),
        )
        with transaction(self.engine, self.dialect) as conn:
            picked = conn.execute(
                self.dialect.for_update(
                    select(_b.id)
                    .where(_b.status.in_(OPEN_BATCH), free, due)
                    .order_by(func.coalesce(_b.next_poll_at, _b.created_at), _b.id)
                    .limit(1)
                )
            ).scalar()
            if picked is None:
                return None
            row = conn.execute(
                update(batches)
                .where(_b.id == picked)
                .values(
                    lease_owner=worker,
                    lease_token=_b.lease_token + 1,
                    lease_expires_at=db_now_plus(lease_seconds),
                    updated_at=db_now(),
                )
                .returning(*batches.c)
            ).one()
            return dict(row._mapping)

    def renew_batch(self, lease: BatchLease, lease_seconds: float) -> bool:
        with transaction(self.engine, self.dialect) as conn:
            return bool(
                conn.execute(_FENCE.values(lease_expires_at=db_now_plus(lease_seconds)), _lease_params(lease)).rowcount
            )

    def release_batch(self, lease: BatchLease, poll_in: float | None = None) -> None:
        """End a step: the lease is let go (any daemon may take the next step), next poll set."""
        with transaction(self.engine, self.dialect) as conn:
            _fence(conn, lease, **_released(poll_in))

    def release_batch_leases(self, worker: str) -> int:
        """At start (a previous process under this worker id) or at stop: every batch lease
        held under `worker` is let go, so the next step is taken at once, by any daemon."""
        with transaction(self.engine, self.dialect) as conn:
            return int(
                conn.execute(
                    update(batches)
                    .where(_b.lease_owner == worker)
                    .values(lease_owner=None, lease_expires_at=None, updated_at=db_now())
                ).rowcount
            )

    # -- submission ------------------------------------------------------------

    def set_input_file(self, lease: BatchLease, file_id: str) -> None:
        """The uploaded input's id, stored before the create call that uses it."""
        with transaction(self.engine, self.dialect) as conn:
            _fence(conn, lease, input_file_id=file_id)

    def mark_submitted(
        self, lease: BatchLease, provider_batch_id: str, provider_status: str, poll_in: float, *, adopted: bool = False
    ) -> None:
        """The provider has the batch: recorded, and the step's lease let go until the first poll."""
        with transaction(self.engine, self.dialect) as conn:
            _fence(
                conn,
                lease,
                status=BatchStatus.SUBMITTED.value,
                provider_batch_id=provider_batch_id,
                provider_status=provider_status,
                submitted_at=func.coalesce(_b.submitted_at, db_now()),
                adopted_at=db_now() if adopted else None,
                poll_error=None,
                **_released(poll_in),
            )

    def note_poll(
        self,
        lease: BatchLease,
        *,
        provider_status: str | None = None,
        counts: dict[str, int] | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        poll_error: str | None = None,
        release_for: float | None = None,
    ) -> None:
        """What a poll saw. A local error goes to `poll_error` only: never over what the provider said.
        With `release_for`, the step ends here: lease let go, next poll that many seconds away."""
        values: dict[str, Any] = {"poll_error": poll_error}
        if provider_status is not None:
            values |= {"provider_status": provider_status, "request_counts": counts}
            values |= {"output_file_id": output_file_id, "error_file_id": error_file_id}
        if release_for is not None:
            values |= _released(release_for)
        with transaction(self.engine, self.dialect) as conn:
            _fence(conn, lease, **values)

    # -- mapping results back --------------------------------------------------

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
            self.dialect.serialize_claimers(conn)  # the lock order of every multi-row writer
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
            self.dialect.serialize_claimers(conn)  # the lock order of every multi-row writer
            row = _fence(conn, lease)
            left = list(conn.execute(select(_r.id).where(_r.batch_id == lease.id, _r.status == SUBMITTED)).scalars())
            if row.cancel_requested_at is not None:
                mapped.canceled = _end_canceled(conn, lease.id, left)
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

    # -- cancel and audit ------------------------------------------------------

    def request_batch_cancel(self, *, batch_id: int | None = None, job_id: str | None = None) -> list[dict[str, Any]]:
        """Mark open batches for cancel; returns them (id, status, provider, provider_batch_id)."""
        where = [_b.status.in_(OPEN_BATCH)]
        if batch_id is not None:
            where.append(_b.id == batch_id)
        if job_id is not None:
            where.append(_b.job_id == job_id)
        with transaction(self.engine, self.dialect) as conn:
            rows = conn.execute(
                update(batches)
                .where(*where)
                .values(cancel_requested_at=func.coalesce(_b.cancel_requested_at, db_now()), updated_at=db_now())
                .returning(_b.id, _b.status, _b.provider, _b.provider_batch_id, _b.cancel_sent_at)
            )
            return [dict(r._mapping) for r in rows]

    def note_cancel_sent(self, batch_id: int) -> None:
        """The provider took the cancel (from a poll step or from `ledger cancel --batch`): poll now."""
        with transaction(self.engine, self.dialect) as conn:
            conn.execute(
                update(batches)
                .where(_b.id == batch_id, _b.cancel_sent_at.is_(None))
                .values(cancel_sent_at=db_now(), next_poll_at=db_now(), updated_at=db_now())
            )

    def get_batch(self, batch_id: int) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(batches).where(_b.id == batch_id)).first()
            return dict(row._mapping) if row is not None else None

    def has_batch_work(self) -> bool:
        """Batch requests queued (due or not) or submitted, or a batch not over yet."""
        pending = select(literal(1)).where(
            or_(
                and_(_r.delivery == BATCH, _r.status == QUEUED),
                _r.status == SUBMITTED,
            )
        )
        open_batch = select(literal(1)).where(_b.status.in_(OPEN_BATCH))
        with self.engine.connect() as conn:
            return (
                conn.execute(pending.limit(1)).first() is not None
                or conn.execute(open_batch.limit(1)).first() is not None
            )


def _released(poll_in: float | None) -> dict[str, Any]:
    """Column values that end a step: the lease let go, and the next poll when given."""
    values: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if poll_in is not None:
        values["next_poll_at"] = db_now_plus(poll_in)
    return values


def _lease_params(lease: BatchLease) -> dict[str, Any]:
    return {"b_batch": lease.id, "b_token": lease.token, "b_worker": lease.worker}


def _fence(conn: Connection, lease: BatchLease, **values: Any) -> Any:
    """Touch the batch under this lease (row-locking it until commit); raise if it is not ours."""
    row = conn.execute(
        _FENCE.values(updated_at=db_now(), **values).returning(_b.id, _b.cancel_requested_at), _lease_params(lease)
    ).first()
    if row is None:
        raise BatchLeaseLost(f"batch {lease.id}: lease {lease.token} is no longer {lease.worker}'s")
    return row


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
            succeeded.append(
                {"id": x.request_id, "raw": x.text, "tin": x.input_tokens, "tout": x.output_tokens, "cost": x.cost_usd}
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
                    "message": x.message,
                    "status_code": x.status_code,
                }
            )
        ended.append(
            {
                "id": x.request_id,
                "outcome": _ATTEMPT_OUTCOME[x.kind],
                "status_code": x.status_code,
                "code": x.error_code,
                "message": x.message,
                "delay": delay,
            }
        )
    if succeeded:
        params = {"b_rows": json_param(succeeded), "b_batch": batch_id}
        mapped.completed = dialect.execute(conn, _MAP_SUCCEEDED, params).rowcount
    if failed:
        params = {"b_rows": json_param(failed), "b_batch": batch_id}
        statuses = list(dialect.execute(conn, _MAP_FAILED, params).scalars())
        mapped.retried = statuses.count(QUEUED)
        mapped.failed = len(statuses) - mapped.retried
    if ended:
        dialect.execute(conn, _CLOSE_ATTEMPTS, {"b_rows": json_param(ended), "b_batch": batch_id})
    mapped.requeued = _requeue(conn, batch_id, [x.request_id for x in lines if x.kind in ("expired", "canceled")])
    mapped.kept = len(lines) - mapped.completed - mapped.failed - mapped.retried - mapped.requeued
    return mapped


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


def _affordable(conn: Connection, ids: Sequence[int], daily_budget: float | None) -> list[int]:
    """The ids whose worst-case cost fits today's budget and their jobs' (all, when no cap applies)."""
    rows: list[Any] = []
    for start in range(0, len(ids), _ATTACH_CHUNK):
        rows += conn.execute(
            select(_r.id, _r.job_id, _r.estimate_usd)
            .where(_r.id.in_(list(ids[start : start + _ATTACH_CHUNK])), _r.status == QUEUED)
            .order_by(_r.id)
        ).all()
    budget = Budget.read(conn, daily_budget, rows)
    return [int(row.id) for row in budget.affordable(rows)]
