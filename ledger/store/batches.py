"""Provider batch jobs' SQL: grouping, attaching requests, batch leases, submission, cancel.
Writing results back is `batch_results.py`.

Invariants every statement here keeps:
- A batch row is leased like a request (`lease_owner`, `lease_token`): every write a
  step makes to a batch (and, through it, to its requests) is fenced by the token,
  so two daemons never submit or map the same batch, and one whose lease was taken
  over changes nothing (`BatchLeaseLost`).
- A request is attached to a batch (status `submitted`, `batch_id`, its attempt row
  opened and counted) in the transaction that makes the batch `submitting`, before
  any provider call (its result is then written only while it is still
  `submitted` in that very batch: see `batch_results.py`).
- Transactions that update many request rows take the ledger's turn alone first (they then
  never run beside a claim or a group commit, which hold it shared: docs/architecture.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    String,
    and_,
    bindparam,
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
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import ColumnElement

from ledger.statuses import AttemptOutcome, BatchStatus, Delivery, RequestStatus
from ledger.store.budget import Budget
from ledger.store.claim import QUEUED
from ledger.store.commit import any_row, reading, transaction
from ledger.store.dialect import Dialect, db_now, db_now_plus, unindexed
from ledger.store.row_sets import bound_rows
from ledger.store.schema import one_line
from ledger.store.tables import attempts, batches, requests

_r, _b, _a = requests.c, batches.c, attempts.c

LOG = logging.getLogger("ledger.store")
SUBMITTED = RequestStatus.SUBMITTED.value
BATCH = Delivery.BATCH.value
OPEN_BATCH = (BatchStatus.QUEUED.value, BatchStatus.SUBMITTING.value, BatchStatus.SUBMITTED.value)
_ATTACH_CHUNK = 10_000  # requests per attaching statement
# A batch not over yet (the small table: read before the requests, see `Store.has_work`).
OPEN_BATCHES = select(literal(1)).where(_b.status.in_(OPEN_BATCH))
_BATCH_REQUESTS_LEFT = select(literal(1)).where(
    or_(and_(_r.delivery == BATCH, _r.status == QUEUED), _r.status == SUBMITTED)
)


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


_FENCE = update(batches).where(
    _b.id == bindparam("b_batch"), _b.lease_token == bindparam("b_token"), _b.lease_owner == bindparam("b_worker")
)
_ATTACHED = bound_rows("v", "b_rows", column("id", BigInteger))
# Rows are reached by id from the chunk; these checks are made on each (`unindexed`).
_in_batch, _status = unindexed(_r.batch_id) == bindparam("b_batch"), unindexed(_r.status)

_ATTACH = (
    update(requests)
    .where(_r.id == _ATTACHED.c.id, _status == QUEUED, unindexed(_r.delivery) == BATCH, _r.twin_of.is_(None))
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


class BatchQueries:
    """Mixed into `Store`; needs `engine`, `dialect` and `job_caps` (ClaimQueries)."""

    engine: Engine
    dialect: Dialect
    job_caps: dict[str, float | None]

    # -- forming batches -------------------------------------------------------

    def move_to_online(self, batch_providers: Iterable[str]) -> dict[str, int]:
        """Queued batch requests of providers without a batch API go through the online path."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
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

    def end_unconfigured_batch_requests(self, provider: str, message: str) -> int:
        """Queued batch requests of a provider the daemon cannot call (its API key is missing) end
        `error` with `config_error` and `message`: no batch is opened for them, nothing is sent."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            ended = conn.execute(
                update(requests)
                .where(_r.status == QUEUED, _r.delivery == BATCH, _r.provider == provider)
                .values(
                    status=RequestStatus.ERROR.value,
                    error_code="config_error",
                    error_message=message,
                    completed_at=db_now(),
                    updated_at=db_now(),
                )
            )
            return int(ended.rowcount)

    def batch_groups(self, wait_seconds: float) -> list[BatchGroup]:
        """Groups of due batch requests, each with whether its oldest has waited long enough."""
        key = (_r.provider, _r.model, _r.batch_key, _r.job_id)
        query = (
            select(*key, func.count(), func.min(_r.next_attempt_at) <= db_now_plus(-wait_seconds))
            .where(_r.status == QUEUED, _r.delivery == BATCH, _r.next_attempt_at <= db_now(), _r.twin_of.is_(None))
            .group_by(*key)
            .order_by(func.min(_r.next_attempt_at))
        )
        with reading(self.engine) as conn:
            return [BatchGroup(p, m, k, j, int(n), bool(w)) for p, m, k, j, n, w in conn.execute(query)]

    def open_batch(self, group: BatchGroup, worker: str, lease_seconds: float, submit_key: str) -> BatchLease:
        """The batch row, leased to `worker`, before any request is attached (status `queued`)."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
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
                _r.twin_of.is_(None),  # twins never go in a batch: they wait for their original
                _r.provider == group.provider,
                _r.model == group.model,
                _r.batch_key.is_(None) if group.batch_key is None else _r.batch_key == group.batch_key,
                _r.job_id.is_(None) if group.job_id is None else _r.job_id == group.job_id,
            )
            .order_by(_r.priority.desc(), _r.fair_seq, _r.id)
            .limit(limit)
        )
        with reading(self.engine) as conn:
            return list(conn.execute(query).scalars())

    def request_inputs(self, ids: Sequence[int]) -> list[Any]:
        """What a batch input line needs of each request, in the order of `ids`."""
        query = select(_r.id, _r.model, _r.input, _r.params, _r.response_format, _r.api).where(
            _r.id.in_(bindparam("b_ids", expanding=True))
        )
        with reading(self.engine) as conn:
            found = {row.id: row for row in conn.execute(query, {"b_ids": list(ids)})}
        return [found[i] for i in ids if i in found]

    def batch_parsers(self, batch_id: int) -> dict[int, tuple[str, Any, Any]]:
        """The batch's requests that are parsed when their answer comes: id -> (parse, response
        format, params). Read once before its results are mapped (most batches have none)."""
        query = select(_r.id, _r.parse, _r.response_format, _r.params).where(
            _r.batch_id == batch_id, _r.parse.is_not(None)
        )
        with reading(self.engine) as conn:
            return {row.id: (row.parse, row.response_format, row.params) for row in conn.execute(query)}

    def batch_request_ids(self, batch_id: int) -> list[int]:
        """The requests attached to a batch and still waiting for it, in id order (its input's order)."""
        query = select(_r.id).where(_r.batch_id == batch_id, _r.status == SUBMITTED).order_by(_r.id)
        with reading(self.engine) as conn:
            return list(conn.execute(query).scalars())

    def attach(
        self, lease: BatchLease, ids: Sequence[int], input_bytes: int, daily_budget: float | None = None
    ) -> list[int]:
        """Attach requests to the batch (those still queued): `submitted`, attempt counted and opened.

        Like a claim, an attach reserves each request's worst-case cost against today's
        budget and its job's, under the ledger's turn alone: requests that do not fit stay queued
        for a later batch. Returns the ids attached, in id order; the batch becomes
        `submitting`. A batch with nothing left to attach (all canceled meanwhile, or
        none affordable) is deleted.
        """
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # a writer of many rows: the ledger's turn alone
            _fence(conn, lease)
            ids = _affordable(conn, ids, daily_budget, self.job_caps)
            for start in range(0, len(ids), _ATTACH_CHUNK):
                rows = _ATTACHED.bind({"id": i} for i in ids[start : start + _ATTACH_CHUNK])
                self.dialect.execute(conn, _ATTACH, {**rows, "b_batch": lease.id})
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
        self._refresh_statistics_after_attach(lease.id)
        return sorted(attached)

    def _refresh_statistics_after_attach(self, batch_id: int) -> None:
        """The mapping's plans need to know the attempts just opened exist; only a speed-up, so its
        own failure is logged, never raised. The attach has committed: raised, the lane would run
        the attach again, find its requests no longer queued and delete the batch they are in."""
        try:
            with transaction(self.engine, self.dialect) as conn:
                self.dialect.refresh_statistics(conn, attempts)
        except DBAPIError as exc:
            LOG.warning(
                "statistics not refreshed after attaching a batch",
                extra={"details": {"batch_id": batch_id, "error": one_line(exc)}},
            )

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
        # Rerunnable: a batch leased by a run whose COMMIT answer was lost is ours (`free` takes
        # our own leases), so the next run leases it again (or takes another, and that lease
        # lapses unused); the daemon's idle poll writes nothing at all.
        with transaction(self.engine, self.dialect, rerunnable=True) as conn:
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
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            return bool(
                conn.execute(_FENCE.values(lease_expires_at=db_now_plus(lease_seconds)), _lease_params(lease)).rowcount
            )

    def release_batch(self, lease: BatchLease, poll_in: float | None = None) -> None:
        """End a step: the lease is let go (any daemon may take the next step), next poll set."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            _fence(conn, lease, **_released(poll_in))

    def release_batch_leases(self, worker: str) -> int:
        """At start (a previous process under this worker id) or at stop: every batch lease
        held under `worker` is let go, so the next step is taken at once, by any daemon."""
        with transaction(self.engine, self.dialect, rerunnable=True) as conn:
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
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            _fence(conn, lease, input_file_id=file_id)

    def mark_submitted(
        self, lease: BatchLease, provider_batch_id: str, provider_status: str, poll_in: float, *, adopted: bool = False
    ) -> None:
        """The provider has the batch: recorded, and the step's lease let go until the first poll."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
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
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            _fence(conn, lease, **values)

    # -- cancel and audit ------------------------------------------------------

    def request_batch_cancel(self, *, batch_id: int | None = None, job_id: str | None = None) -> list[dict[str, Any]]:
        """Mark open batches for cancel; returns them (id, status, provider, provider_batch_id)."""
        where: list[ColumnElement[bool]] = [_b.status.in_(OPEN_BATCH)]
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
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            conn.execute(
                update(batches)
                .where(_b.id == batch_id, _b.cancel_sent_at.is_(None))
                .values(cancel_sent_at=db_now(), next_poll_at=db_now(), updated_at=db_now())
            )

    def get_batch(self, batch_id: int) -> dict[str, Any] | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(batches).where(_b.id == batch_id)).first()
            return dict(row._mapping) if row is not None else None

    def has_batch_work(self) -> bool:
        """A batch not over yet, or batch requests queued (due or not) or submitted."""
        return any_row(self.engine, OPEN_BATCHES, _BATCH_REQUESTS_LEFT)


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
        _FENCE.values(updated_at=db_now(), **values).returning(_b.id, _b.cancel_requested_at, _b.fallback_at),
        _lease_params(lease),
    ).first()
    if row is None:
        raise BatchLeaseLost(f"batch {lease.id}: lease {lease.token} is no longer {lease.worker}'s")
    return row


def _affordable(
    conn: Connection, ids: Sequence[int], daily_budget: float | None, caps: dict[str, float | None]
) -> list[int]:
    """The ids whose worst-case cost fits today's budget and their jobs' (all, when no cap applies)."""
    rows: list[Any] = []
    for start in range(0, len(ids), _ATTACH_CHUNK):
        rows += conn.execute(
            select(_r.id, _r.job_id, _r.estimate_usd)
            .where(_r.id.in_(list(ids[start : start + _ATTACH_CHUNK])), _r.status == QUEUED)
            .order_by(_r.id)
        ).all()
    budget = Budget.read(conn, daily_budget, rows, caps)
    return [int(row.id) for row in budget.affordable(rows)]
