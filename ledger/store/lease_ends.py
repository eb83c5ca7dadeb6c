"""Leases: a claimed row as the daemon holds it, kept alive while its call runs, ended without
an outcome when its worker dies, stops or restarts.

A claim (`claim.py`) turns a row `running` under a lease; from then on this module's
statements keep it (`renew_leases`, `extend_leases`) or end it with no outcome
(`end_leases`: back to the queue, canceled, or spent), whoever notices: the claim's
reclaim of expired leases, a stopping daemon, a daemon restarted under the same worker id.
Every statement here is fenced on `status = 'running'` and, where it knows one, the lease
token: a lease taken over since is left alone.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, or_, select, tuple_, update
from sqlalchemy.engine import Connection, Engine

from ledger.statuses import AttemptOutcome, RequestStatus
from ledger.store.commit import transaction
from ledger.store.dialect import Dialect, db_now, db_now_plus, read_json_column
from ledger.store.rows import ClaimedRequest, ReleasedRows
from ledger.store.tables import attempts, requests, workers

RUNNING = RequestStatus.RUNNING.value
QUEUED = RequestStatus.QUEUED.value
CANCELED = RequestStatus.CANCELED.value
ERROR = RequestStatus.ERROR.value
# A lease a worker holds, as it knows it: (request id, lease token).
Held = tuple[int, int]

_c = requests.c
CLAIMED_COLUMNS = (
    _c.id,
    _c.lease_token,
    _c.attempts,
    _c.idempotency_key,
    _c.job_id,
    _c.provider,
    _c.model,
    _c.endpoint,
    _c.input,
    _c.params,
    _c.response_format,
    _c.trace,
    _c.api,
    _c.parse,
    _c.parked,
)


def to_claimed(row: Any) -> ClaimedRequest:
    return ClaimedRequest(
        id=row.id,
        token=row.lease_token,
        attempt=row.attempts,
        idempotency_key=row.idempotency_key,
        job_id=row.job_id,
        provider=row.provider,
        model=row.model,
        endpoint=row.endpoint,
        input=read_json_column(row.input),
        params=read_json_column(row.params) or {},
        response_format=read_json_column(row.response_format),
        stored_trace=row.trace,
        api=row.api,
        parse=row.parse,
        parked=row.parked,
    )


_ACTIVE = select(func.count()).select_from(requests).where(_c.status == RUNNING)
# Expired leases, each locked as it is found; one another transaction holds (its owner writing its
# outcome late, another claimer reclaiming it) is left to that transaction: a reclaim never waits.
_EXPIRED = select(_c.id).where(_c.status == RUNNING, _c.lease_expires_at < db_now())


class LeaseQueries:
    """Mixed into `Store` (through `ClaimQueries`); needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    def _active(self, conn: Connection) -> int:
        return int(conn.execute(_ACTIVE).scalar_one())

    def retire_worker(self, worker: str) -> None:
        """A daemon that stops cleanly leaves the registry, so the others' shares grow at once."""
        with transaction(self.engine, self.dialect, rerunnable=True) as conn:
            conn.execute(workers.delete().where(workers.c.worker_id == worker))

    def renew_leases(
        self, worker: str, lease_seconds: float, held: Collection[Held] = (), *, wait_at_most: float | None = None
    ) -> list[Held]:
        """Heartbeat (for fair shares) and extend the leases of the requests this worker is working on.

        Only `held` (request id, lease token), never "every row with my name": a row
        the worker holds in the database without knowing it (a previous process
        under the same worker id) must expire and be reclaimed, not be kept alive
        forever with nobody calling it; and a row claimed again since (a new
        token) is renewed by the executor working on that claim, not by this one.
        `wait_at_most` bounds the database's waits (locks, statements): a renewal
        given up on by the caller must not land later and revive leases let go.
        Returns the leases renewed: one held but not returned is no longer ours.
        """
        with transaction(self.engine, self.dialect) as conn:
            if wait_at_most is not None:
                self.dialect.bound_waits(conn, wait_at_most)
            self.dialect.writer_turn(conn, worker)  # ordered with this daemon's records and claims
            conn.execute(self.dialect.upsert(workers, ["worker_id"], {"worker_id": worker}, {"heartbeat_at": db_now()}))
            return extend_leases(conn, worker, lease_seconds, held)

    def release_worker(self, worker: str, max_attempts: int, why: str | None = None) -> ReleasedRows:
        """Give back every slot held under `worker`: a stopping daemon's cut-off calls, or at start,
        what a previous process with the same worker id left behind (see `end_leases`)."""
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.writer_turn(conn, worker)  # ordered with this daemon's records and claims
            rows = end_leases(
                conn,
                and_(_c.lease_owner == worker, _c.status == RUNNING),
                LeaseEnd("worker_stopped", why or "worker stopped before the call finished", max_attempts),
            )
            active = self._active(conn)
            ts = time.time()
        return ReleasedRows(rows, active, ts)


@dataclass(frozen=True)
class LeaseEnd:
    """Why leases are being ended without an outcome, for the rows and attempts it touches."""

    spent_code: str  # error_code of a request that has no attempt left
    why_lost: str  # error_message of the cut-off attempt
    max_attempts: int


def extend_leases(conn: Connection, worker: str, lease_seconds: float, held: Collection[Held]) -> list[Held]:
    """Extend the leases `held` (id, token) under `worker`; returns those still its own."""
    if not held:
        return []
    rows = conn.execute(
        update(requests)
        .where(tuple_(_c.id, _c.lease_token).in_(list(held)), _c.lease_owner == worker, _c.status == RUNNING)
        .values(lease_expires_at=db_now_plus(lease_seconds))
        .returning(_c.id, _c.lease_token)
    )
    return sorted((int(r.id), int(r.lease_token)) for r in rows)


def end_leases(conn: Connection, which: Any, end: LeaseEnd) -> list[ClaimedRequest]:
    """End the leases of claimed rows whose call has no outcome (worker dead, stopped or restarted).

    Each row ends one way, decided in the one UPDATE: `canceled` if a cancel was
    waiting for its call, `error` if the cut-off call was its last attempt
    (RETRY_MAX_ATTEMPTS bounds paid calls however often a worker dies), otherwise
    back to `queued`. The open attempt becomes `lost` (it may have been paid for);
    the attempt counter keeps it, so the next claim continues with the next number.
    """
    canceled = _c.cancel_requested_at.is_not(None)
    spent = _c.attempts - _c.parked >= end.max_attempts  # calls refused for a spent quota do not count
    ending = case((canceled, CANCELED), (spent, ERROR), else_=QUEUED)
    rows = conn.execute(
        update(requests)
        .where(which)
        .values(
            status=ending,
            lease_owner=None,
            lease_expires_at=None,
            error_code=case((canceled, "canceled"), (spent, end.spent_code), else_=_c.error_code),
            error_message=case(
                (canceled, "canceled while a call was in flight; the call never reported back"),
                (spent, f"{end.why_lost}, during the last of {end.max_attempts} attempts"),
                else_=_c.error_message,
            ),
            completed_at=case((or_(canceled, spent), db_now()), else_=_c.completed_at),
            reserved_usd=None,
            updated_at=db_now(),
        )
        .returning(*CLAIMED_COLUMNS)
    ).all()
    if rows:
        conn.execute(
            update(attempts)
            .where(
                attempts.c.request_id.in_([r.id for r in rows]),
                attempts.c.outcome == AttemptOutcome.RUNNING.value,
            )
            .values(outcome=AttemptOutcome.LOST.value, finished_at=db_now(), error_message=end.why_lost)
        )
    return [to_claimed(r) for r in rows]


def reclaim_expired(conn: Connection, dialect: Dialect, max_attempts: int) -> list[ClaimedRequest]:
    """End the leases of dead workers: back to the queue, or canceled / spent (see `end_leases`).
    Each row locked as found, skipping one another transaction holds: a reclaim never waits."""
    return end_leases(
        conn,
        and_(_c.id.in_(dialect.for_update(_EXPIRED).scalar_subquery()), _c.status == RUNNING),
        LeaseEnd("lease_expired", "lease expired: the worker stopped renewing it", max_attempts),
    )
