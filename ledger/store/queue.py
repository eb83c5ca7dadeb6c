"""The hot path's SQL: enqueue, claim (= take a slot), record outcomes, leases.

Invariants every statement here keeps:
- A row with status `running` is an occupied slot; the claim transaction counts
  them per pool and in total *after* serialising claimers, so no number of
  daemon processes can overshoot a limit.
- Every write to a claimed row carries its fencing token and `status='running'`:
  a worker whose lease was taken over, or whose request was canceled, changes
  nothing (cancel wins over a late completion).
- Times are the database's (`db_now`), never the process's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.engine import Connection, Engine

from ledger.models import (
    AttemptOutcome,
    Delivery,
    Job,
    LlmAttempt,
    LlmPool,
    LlmRequest,
    RequestStatus,
)
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.rows import (
    Claim,
    ClaimedRequest,
    Completed,
    Failed,
    Outcome,
    Recorded,
    ReleasedRows,
)

requests = LlmRequest.__table__  # type: ignore[attr-defined]
attempts = LlmAttempt.__table__  # type: ignore[attr-defined]
jobs = Job.__table__  # type: ignore[attr-defined]
pools = LlmPool.__table__  # type: ignore[attr-defined]

RUNNING = RequestStatus.RUNNING.value
QUEUED = RequestStatus.QUEUED.value
# How many candidates to read per free slot: some may belong to pools that fill up.
_CANDIDATES_PER_SLOT = 4
# New rows reported back for per-request events; beyond this an enqueue reports counts only,
# so memory stays flat however large the input is.
KEEP_INSERTED_MAX = 10_000


@dataclass(frozen=True)
class EnqueueResult:
    inserted: int
    duplicates: int
    queue_depth: int  # queued requests after this enqueue
    inserted_rows: list[dict[str, Any]]  # id, key, trace of each new row; empty past KEEP_INSERTED_MAX


def _claimed_columns() -> list[Any]:
    c = requests.c
    return [
        c.id,
        c.lease_token,
        c.attempts,
        c.idempotency_key,
        c.job_id,
        c.provider,
        c.model,
        c.endpoint,
        c.input,
        c.params,
        c.response_format,
        c.trace,
    ]


def _to_claimed(row: Any) -> ClaimedRequest:
    return ClaimedRequest(
        id=row.id,
        token=row.lease_token,
        attempt=row.attempts,
        idempotency_key=row.idempotency_key,
        job_id=row.job_id,
        provider=row.provider,
        model=row.model,
        endpoint=row.endpoint,
        input=row.input,
        params=row.params or {},
        response_format=row.response_format,
        trace=row.trace or {},
    )


class QueueQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    # -- enqueue ---------------------------------------------------------------

    def enqueue(self, rows: Iterable[dict[str, Any]], batch_size: int = 1000) -> EnqueueResult:
        """Insert rows idempotently, all or nothing.

        `rows` may be a lazy iterator that raises half-way (a bad line): the whole
        transaction rolls back, so nothing is half written. Rows are inserted in
        batches so memory stays bounded whatever the size of the input.
        """
        kept: list[dict[str, Any]] = []
        inserted = seen = 0
        with self.engine.begin() as conn:
            next_seq: dict[str | None, int] = {}
            batch: list[dict[str, Any]] = []
            for row in rows:
                job_id = row.get("job_id")
                if job_id not in next_seq:
                    next_seq[job_id] = self._max_fair_seq(conn, job_id) + 1
                    if job_id is not None:
                        conn.execute(
                            self.dialect.insert_ignore(jobs, ["id"]), {"id": job_id, "status": "running"}
                        )
                batch.append({**row, "fair_seq": next_seq[job_id]})
                next_seq[job_id] += 1
                if len(batch) >= batch_size:
                    new = self._insert_batch(conn, batch)
                    seen, inserted, batch = seen + len(batch), inserted + len(new), []
                    kept = kept + new if len(kept) + len(new) <= KEEP_INSERTED_MAX else []
            if batch:
                new = self._insert_batch(conn, batch)
                seen, inserted = seen + len(batch), inserted + len(new)
                kept = kept + new if len(kept) + len(new) <= KEEP_INSERTED_MAX else []
            depth = conn.execute(
                select(func.count()).select_from(requests).where(requests.c.status == QUEUED)
            ).scalar_one()
        return EnqueueResult(inserted, seen - inserted, depth, kept if len(kept) == inserted else [])

    def id_for_key(self, idempotency_key: str) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(requests.c.id).where(requests.c.idempotency_key == idempotency_key)
                ).scalar_one()
            )

    def _max_fair_seq(self, conn: Connection, job_id: str | None) -> int:
        where = requests.c.job_id.is_(None) if job_id is None else requests.c.job_id == job_id
        return int(
            conn.execute(select(func.coalesce(func.max(requests.c.fair_seq), 0)).where(where)).scalar_one()
        )

    def _insert_batch(self, conn: Connection, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        stmt = (
            self.dialect.insert_ignore(requests, ["idempotency_key"])
            .values(created_at=db_now(), updated_at=db_now(), next_attempt_at=db_now())
            .returning(requests.c.id, requests.c.idempotency_key, requests.c.trace)
        )
        return [dict(r._mapping) for r in conn.execute(stmt, batch)]

    # -- claim -----------------------------------------------------------------

    def claim(
        self,
        worker: str,
        *,
        lease_seconds: float,
        global_limit: int,
        pool_limit: Callable[[str], int],
        max_attempts: int,
        max_claims: int,
    ) -> Claim:
        """Take as many due requests as free slots allow, in one serialised transaction."""
        c = requests.c
        with self.engine.begin() as conn:
            self.dialect.serialize_claimers(conn)
            reclaimed = self._reclaim_expired(conn, max_attempts)
            in_flight: dict[str, int] = dict(
                conn.execute(
                    select(c.endpoint, func.count()).where(c.status == RUNNING).group_by(c.endpoint)
                ).all()
            )
            total = sum(in_flight.values())
            free_total = min(global_limit - total, max_claims)
            if free_total <= 0:
                return Claim([], total, reclaimed)
            cooling = set(
                conn.execute(select(pools.c.endpoint).where(pools.c.cooldown_until > db_now())).scalars()
            )
            full = {ep for ep, n in in_flight.items() if n >= pool_limit(ep)} | cooling
            query = (
                select(c.id, c.endpoint)
                .where(c.status == QUEUED, c.delivery == Delivery.ONLINE.value, c.next_attempt_at <= db_now())
                .order_by(c.priority.desc(), c.fair_seq, c.id)
                .limit(free_total * _CANDIDATES_PER_SLOT)
            )
            if full:
                query = query.where(c.endpoint.not_in(full))
            picked: list[int] = []
            taken: dict[str, int] = {}
            for row in conn.execute(self.dialect.for_update(query)):
                used = in_flight.get(row.endpoint, 0) + taken.get(row.endpoint, 0)
                if used < pool_limit(row.endpoint):
                    picked.append(row.id)
                    taken[row.endpoint] = taken.get(row.endpoint, 0) + 1
                    if len(picked) == free_total:
                        break
            if not picked:
                return Claim([], total, reclaimed)
            claimed = [
                _to_claimed(r)
                for r in conn.execute(
                    update(requests)
                    .where(c.id.in_(picked), c.status == QUEUED)
                    .values(
                        status=RUNNING,
                        lease_owner=worker,
                        lease_token=c.lease_token + 1,
                        lease_expires_at=db_now_plus(lease_seconds),
                        attempts=c.attempts + 1,
                        updated_at=db_now(),
                    )
                    .returning(*_claimed_columns())
                )
            ]
            conn.execute(
                insert(attempts).values(started_at=db_now()),
                [
                    {
                        "request_id": r.id,
                        "attempt": r.attempt,
                        "worker": worker,
                        "outcome": AttemptOutcome.RUNNING.value,
                    }
                    for r in claimed
                ],
            )
            return Claim(sorted(claimed, key=lambda r: picked.index(r.id)), total + len(claimed), reclaimed)

    def _reclaim_expired(self, conn: Connection, max_attempts: int) -> int:
        """Put the rows of dead workers back in the queue (or end them if out of attempts)."""
        c = requests.c
        expired = conn.execute(
            update(requests)
            .where(c.status == RUNNING, c.lease_expires_at < db_now())
            .values(status=QUEUED, lease_owner=None, lease_expires_at=None, updated_at=db_now())
            .returning(c.id, c.attempts)
        ).all()
        if not expired:
            return 0
        ids = [row.id for row in expired]
        conn.execute(
            update(attempts)
            .where(attempts.c.request_id.in_(ids), attempts.c.outcome == AttemptOutcome.RUNNING.value)
            .values(
                outcome=AttemptOutcome.LOST.value,
                finished_at=db_now(),
                error_message="lease expired: the worker stopped renewing it",
            )
        )
        spent = [row.id for row in expired if row.attempts >= max_attempts]
        if spent:
            conn.execute(
                update(requests)
                .where(c.id.in_(spent))
                .values(
                    status=RequestStatus.ERROR.value,
                    error_code="lease_expired",
                    error_message=f"worker lost during attempt {max_attempts} of {max_attempts}",
                    completed_at=db_now(),
                    updated_at=db_now(),
                )
            )
        return len(expired)

    # -- record ----------------------------------------------------------------

    def record(self, outcomes: list[Outcome]) -> Recorded:
        """Write a group of outcomes in one transaction (group commit).

        The timestamp taken just before the commit is returned so that `released`
        events can be stamped no later than the slot really became free.
        """
        with self.engine.begin() as conn:
            applied = [self._record_one(conn, outcome) for outcome in outcomes]
            active = self._active(conn)
            ts = time.time()
        return Recorded(applied, active, ts)

    def _active(self, conn: Connection) -> int:
        return int(
            conn.execute(
                select(func.count()).select_from(requests).where(requests.c.status == RUNNING)
            ).scalar_one()
        )

    def _fenced(self, request: ClaimedRequest) -> Any:
        c = requests.c
        return and_(c.id == request.id, c.lease_token == request.token, c.status == RUNNING)

    def _finish_attempt(self, conn: Connection, request: ClaimedRequest, attempt: int, **values: Any) -> None:
        conn.execute(
            update(attempts)
            .where(attempts.c.request_id == request.id, attempts.c.attempt == attempt)
            .values(finished_at=db_now(), **values)
        )

    def _record_one(self, conn: Connection, outcome: Outcome) -> bool:
        request = outcome.request
        row: dict[str, Any]
        if isinstance(outcome, Completed):
            self._finish_attempt(
                conn,
                request,
                outcome.attempt,
                outcome=AttemptOutcome.SUCCEEDED.value,
                status_code=outcome.status_code,
                latency_ms=outcome.latency_ms,
            )
            row = dict(
                status=RequestStatus.COMPLETED.value,
                raw_output=outcome.raw_output,
                input_tokens=outcome.input_tokens,
                output_tokens=outcome.output_tokens,
                latency_ms=outcome.latency_ms,
                last_status_code=outcome.status_code,
                error_code=None,
                error_message=None,
                completed_at=db_now(),
                lease_owner=None,
                lease_expires_at=None,
            )
        elif isinstance(outcome, Failed):
            f = outcome.failure
            self._finish_attempt(
                conn,
                request,
                outcome.attempt,
                outcome=AttemptOutcome.FAILED.value,
                status_code=f.status_code,
                error_code=f.error_code,
                error_message=f.message,
                latency_ms=f.latency_ms,
            )
            row = dict(
                status=RequestStatus.ERROR.value,
                error_code=f.error_code,
                error_message=f.message,
                last_status_code=f.status_code,
                latency_ms=outcome.elapsed_ms,
                completed_at=db_now(),
                lease_owner=None,
                lease_expires_at=None,
            )
        else:
            f = outcome.failure
            timed_out = f.error_code == "timeout"
            self._finish_attempt(
                conn,
                request,
                outcome.attempt,
                outcome=(AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.FAILED).value,
                status_code=f.status_code,
                error_code=f.error_code,
                error_message=f.message,
                latency_ms=f.latency_ms,
                retry_delay_s=outcome.delay_s,
            )
            row = dict(
                next_attempt_at=db_now_plus(outcome.delay_s),
                last_status_code=f.status_code,
                error_code=f.error_code,
                error_message=f.message,
            )
            if not outcome.hold_slot:
                row.update(status=QUEUED, lease_owner=None, lease_expires_at=None)
            if outcome.pool_cooldown_s:
                self._cool_down(conn, request.endpoint, outcome.pool_cooldown_s)
        result = conn.execute(
            update(requests).where(self._fenced(request)).values(updated_at=db_now(), **row)
        )
        return bool(result.rowcount)

    def _cool_down(self, conn: Connection, endpoint: str, seconds: float) -> None:
        until = db_now_plus(seconds)
        stmt = self.dialect.upsert(
            pools, ["endpoint"], {"endpoint": endpoint}, {"cooldown_until": until, "updated_at": db_now()}
        )
        conn.execute(stmt)

    def begin_attempt(self, request: ClaimedRequest) -> int | None:
        """After a held back-off: count the next attempt durably before making it.

        Returns the attempt number, or None when the row is no longer ours
        (canceled, or the lease was taken over while we slept).
        """
        c = requests.c
        with self.engine.begin() as conn:
            number = conn.execute(
                update(requests)
                .where(self._fenced(request))
                .values(attempts=c.attempts + 1, updated_at=db_now())
                .returning(c.attempts)
            ).scalar_one_or_none()
            if number is None:
                return None
            conn.execute(
                insert(attempts).values(started_at=db_now()),
                {
                    "request_id": request.id,
                    "attempt": number,
                    "outcome": AttemptOutcome.RUNNING.value,
                    "worker": conn.execute(select(c.lease_owner).where(c.id == request.id)).scalar_one(),
                },
            )
            return int(number)

    # -- leases ----------------------------------------------------------------

    def renew_leases(self, worker: str, lease_seconds: float) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(
                update(requests)
                .where(requests.c.lease_owner == worker, requests.c.status == RUNNING)
                .values(lease_expires_at=db_now_plus(lease_seconds))
            )
            return int(result.rowcount)

    def release_worker(self, worker: str) -> ReleasedRows:
        """A stopping worker gives every slot it still holds back to the queue.

        A call that was cut off is marked `lost` (it may have been paid for); the
        attempt counter keeps it, so the next claim continues with the next number.
        """
        c = requests.c
        with self.engine.begin() as conn:
            rows = conn.execute(
                update(requests)
                .where(c.lease_owner == worker, c.status == RUNNING)
                .values(status=QUEUED, lease_owner=None, lease_expires_at=None, updated_at=db_now())
                .returning(*_claimed_columns())
            ).all()
            if rows:
                conn.execute(
                    update(attempts)
                    .where(
                        attempts.c.request_id.in_([r.id for r in rows]),
                        attempts.c.outcome == AttemptOutcome.RUNNING.value,
                    )
                    .values(
                        outcome=AttemptOutcome.LOST.value,
                        finished_at=db_now(),
                        error_message="worker stopped before the call finished",
                    )
                )
            active = self._active(conn)
            ts = time.time()
        return ReleasedRows([_to_claimed(r) for r in rows], active, ts)

    def cancel(self, *, ids: list[int] | None = None, job_id: str | None = None) -> int:
        """Cancel requests not yet final; a call already running is fenced out when it ends."""
        c = requests.c
        where = [c.status.in_([QUEUED, RUNNING, RequestStatus.SUBMITTED.value])]
        if ids is not None:
            where.append(c.id.in_(ids))
        if job_id is not None:
            where.append(c.job_id == job_id)
        with self.engine.begin() as conn:
            result = conn.execute(
                update(requests)
                .where(*where)
                .values(
                    status=RequestStatus.CANCELED.value,
                    lease_owner=None,
                    lease_expires_at=None,
                    completed_at=db_now(),
                    updated_at=db_now(),
                )
            )
            return int(result.rowcount)

    def has_online_work(self) -> bool:
        """Anything queued (due or not) or in flight for the online path."""
        c = requests.c
        with self.engine.connect() as conn:
            return (
                conn.execute(
                    select(c.id)
                    .where(c.delivery == Delivery.ONLINE.value, c.status.in_([QUEUED, RUNNING]))
                    .limit(1)
                ).first()
                is not None
            )
