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

from sqlalchemy import and_, bindparam, func, insert, literal, select, union_all, update
from sqlalchemy.engine import Connection, Engine

from ledger.models import (
    AttemptOutcome,
    Delivery,
    Job,
    LlmAttempt,
    LlmPool,
    LlmRequest,
    LlmWorker,
    RequestStatus,
)
from ledger.store import pools as pool_state
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.rows import (
    Claim,
    ClaimedRequest,
    Completed,
    Failed,
    Outcome,
    Recorded,
    ReleasedRows,
    RetryLater,
)

requests = LlmRequest.__table__  # type: ignore[attr-defined]
attempts = LlmAttempt.__table__  # type: ignore[attr-defined]
jobs = Job.__table__  # type: ignore[attr-defined]
pools = LlmPool.__table__  # type: ignore[attr-defined]
workers = LlmWorker.__table__  # type: ignore[attr-defined]

RUNNING = RequestStatus.RUNNING.value
QUEUED = RequestStatus.QUEUED.value
# How many candidates to read per free slot: some may belong to pools that fill up.
_CANDIDATES_PER_SLOT = 4
# New rows reported back for per-request events; beyond this an enqueue reports counts only,
# so memory stays flat however large the input is.
KEEP_INSERTED_MAX = 10_000


@dataclass(frozen=True)
class NextAttempt:
    """What `begin_attempt` decided: go on with attempt `number`, or the slot is free now."""

    number: int | None
    active_slots: int
    ts_before_commit: float
    yielded: bool = False


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


# Pseudo pool keys for the claim's bookkeeping rows; real keys always contain ':'.
_LIVE_WORKERS, _MINE = "@workers", "@mine"
# One round trip for the counts a claim needs: slots in use per pool, live daemons, and
# this daemon's own slots.
_CLAIM_STATE = union_all(
    select(requests.c.endpoint, func.count()).where(requests.c.status == RUNNING).group_by(requests.c.endpoint),
    select(literal(_LIVE_WORKERS), func.count()).where(workers.c.heartbeat_at > db_now_plus(bindparam("b_since"))),
    select(literal(_MINE), func.count()).where(
        requests.c.status == RUNNING, requests.c.lease_owner == bindparam("b_worker")
    ),
)


def _kind(outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        return "completed"
    if isinstance(outcome, Failed):
        return "failed"
    return "retry_hold" if outcome.hold_slot else "retry_release"


_EXPECTED_STATUS = {
    "completed": RequestStatus.COMPLETED.value,
    "failed": RequestStatus.ERROR.value,
    "retry_hold": RUNNING,
    "retry_release": QUEUED,
}

_FINISH_ATTEMPT = (
    update(attempts)
    .where(attempts.c.request_id == bindparam("b_id"), attempts.c.attempt == bindparam("b_attempt"))
    .values(
        outcome=bindparam("b_outcome"),
        status_code=bindparam("b_status"),
        error_code=bindparam("b_code"),
        error_message=bindparam("b_message"),
        latency_ms=bindparam("b_latency"),
        retry_delay_s=bindparam("b_delay"),
        finished_at=db_now(),
    )
)


def _attempt_values(o: Outcome) -> dict[str, Any]:
    values: dict[str, Any] = {
        "b_id": o.request.id,
        "b_attempt": o.attempt,
        "b_code": None,
        "b_message": None,
        "b_delay": None,
    }
    if isinstance(o, Completed):
        return values | {
            "b_outcome": AttemptOutcome.SUCCEEDED.value,
            "b_status": o.status_code,
            "b_latency": o.latency_ms,
        }
    f = o.failure
    timed_out = isinstance(o, RetryLater) and f.error_code == "timeout"
    return values | {
        "b_outcome": (AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.FAILED).value,
        "b_status": f.status_code,
        "b_code": f.error_code,
        "b_message": f.message,
        "b_latency": f.latency_ms,
        "b_delay": o.delay_s if isinstance(o, RetryLater) else None,
    }


def _fenced_update() -> Any:
    c = requests.c
    return update(requests).where(c.id == bindparam("b_id"), c.lease_token == bindparam("b_token"), c.status == RUNNING)


_FINAL = {"completed_at": db_now(), "lease_owner": None, "lease_expires_at": None, "updated_at": db_now()}
_RETRY = {
    "next_attempt_at": db_now_plus(bindparam("b_delay")),
    "last_status_code": bindparam("b_status"),
    "error_code": bindparam("b_code"),
    "error_message": bindparam("b_message"),
    "updated_at": db_now(),
}
_REQUEST_UPDATES = {
    "completed": _fenced_update().values(
        status=RequestStatus.COMPLETED.value,
        raw_output=bindparam("b_raw"),
        input_tokens=bindparam("b_in"),
        output_tokens=bindparam("b_out"),
        latency_ms=bindparam("b_latency"),
        last_status_code=bindparam("b_status"),
        error_code=None,
        error_message=None,
        **_FINAL,
    ),
    "failed": _fenced_update().values(
        status=RequestStatus.ERROR.value,
        error_code=bindparam("b_code"),
        error_message=bindparam("b_message"),
        last_status_code=bindparam("b_status"),
        latency_ms=bindparam("b_latency"),
        **_FINAL,
    ),
    "retry_hold": _fenced_update().values(**_RETRY),
    "retry_release": _fenced_update().values(status=QUEUED, lease_owner=None, lease_expires_at=None, **_RETRY),
}


def _request_values(o: Outcome) -> dict[str, Any]:
    values: dict[str, Any] = {"b_id": o.request.id, "b_token": o.request.token}
    if isinstance(o, Completed):
        return values | {
            "b_raw": o.raw_output,
            "b_in": o.input_tokens,
            "b_out": o.output_tokens,
            "b_latency": o.latency_ms,
            "b_status": o.status_code,
        }
    f = o.failure
    values |= {"b_code": f.error_code, "b_message": f.message, "b_status": f.status_code}
    if isinstance(o, Failed):
        return values | {"b_latency": o.elapsed_ms}
    return values | {"b_delay": o.delay_s}


class QueueQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect
    # Pools with a learned limit as of this process's last claim: only their successes are counted.
    learning: set[str] = set()  # noqa: RUF012 - replaced, never mutated

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
                        conn.execute(self.dialect.insert_ignore(jobs, ["id"]), {"id": job_id, "status": "running"})
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
                conn.execute(select(requests.c.id).where(requests.c.idempotency_key == idempotency_key)).scalar_one()
            )

    def _max_fair_seq(self, conn: Connection, job_id: str | None) -> int:
        where = requests.c.job_id.is_(None) if job_id is None else requests.c.job_id == job_id
        return int(conn.execute(select(func.coalesce(func.max(requests.c.fair_seq), 0)).where(where)).scalar_one())

    def _insert_batch(self, conn: Connection, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        stmt = (
            self.dialect.insert_ignore(requests, ["idempotency_key"])
            .values(created_at=db_now(), updated_at=db_now(), next_attempt_at=db_now())
            .returning(requests.c.id, requests.c.idempotency_key, requests.c.trace)
        )
        return [dict(r._mapping) for r in conn.execute(stmt, batch)]

    # -- claim -----------------------------------------------------------------

    def claim(self, worker: str, **limits: Any) -> Claim:
        """Take as many due requests as free slots allow, in one serialised transaction."""
        with self.engine.begin() as conn:
            return self._claim_in(conn, worker, **limits)

    def _claim_in(
        self,
        conn: Connection,
        worker: str,
        *,
        lease_seconds: float,
        global_limit: int,
        pool_limit: Callable[[str], int],
        max_attempts: int,
        max_claims: int,
        reclaim: bool = True,
    ) -> Claim:
        c = requests.c
        self.dialect.serialize_claimers(conn)
        reclaimed = self._reclaim_expired(conn, max_attempts) if reclaim else 0
        in_flight: dict[str, int] = {}
        state = {_LIVE_WORKERS: 0, _MINE: 0}
        for endpoint, n in conn.execute(_CLAIM_STATE, {"b_since": -lease_seconds, "b_worker": worker}):
            if endpoint in state:
                state[endpoint] = n
            else:
                in_flight[endpoint] = n
        total = sum(in_flight.values())
        # Several daemons share the global limit fairly: each holds at most its share.
        share = -(-global_limit // max(state[_LIVE_WORKERS], 1))
        free_total = min(global_limit - total, max_claims, share - state[_MINE])
        if free_total <= 0:
            return Claim([], total, reclaimed)
        cooling, learned = pool_state.read_state(conn, pool_limit)
        self.learning = set(learned)

        def limit_of(endpoint: str) -> int:
            return min(pool_limit(endpoint), learned.get(endpoint, global_limit))

        full = {ep for ep, n in in_flight.items() if n >= limit_of(ep)} | cooling
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
            if used < limit_of(row.endpoint):
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

    def record(self, outcomes: list[Outcome], claim_for: str | None = None, **limits: Any) -> Recorded:
        """Write a group of outcomes in one transaction (group commit), set-based.

        One executemany per kind of change, then one read that tells, per outcome,
        whether its fenced update took effect (same token, expected status). The
        timestamp taken just before the commit is returned so that `released`
        events are stamped no later than the slots really became free.

        With `claim_for` (a worker id) the slots freed here are claimed again in
        the same transaction: one commit per round instead of two.
        """
        with self.engine.begin() as conn:
            conn.execute(_FINISH_ATTEMPT, [_attempt_values(o) for o in outcomes])
            for kind, stmt in _REQUEST_UPDATES.items():
                params = [_request_values(o) for o in outcomes if _kind(o) == kind]
                if params:
                    conn.execute(stmt, params)
            for o in outcomes:
                if isinstance(o, RetryLater) and o.failure.status_code == 429:
                    pool_state.note_rate_limited(conn, self.dialect, o.request.endpoint, o.pool_cooldown_s)
            succeeded = [
                o.request.endpoint for o in outcomes if isinstance(o, Completed) and o.request.endpoint in self.learning
            ]
            if succeeded:
                pool_state.note_successes(conn, succeeded)
            c = requests.c
            now = {
                row.id: (row.lease_token, row.status)
                for row in conn.execute(
                    select(c.id, c.lease_token, c.status).where(c.id.in_([o.request.id for o in outcomes]))
                )
            }
            applied = [now.get(o.request.id) == (o.request.token, _EXPECTED_STATUS[_kind(o)]) for o in outcomes]
            if claim_for:
                claim = self._claim_in(conn, claim_for, **limits)
                active = claim.active_slots - len(claim.requests)
            else:
                claim, active = None, self._active(conn)
            ts = time.time()
        return Recorded(applied, active, ts, claim)

    def _active(self, conn: Connection) -> int:
        return int(
            conn.execute(select(func.count()).select_from(requests).where(requests.c.status == RUNNING)).scalar_one()
        )

    def _fenced(self, request: ClaimedRequest) -> Any:
        c = requests.c
        return and_(c.id == request.id, c.lease_token == request.token, c.status == RUNNING)

    def begin_attempt(self, request: ClaimedRequest) -> NextAttempt:
        """After a held back-off: count the next attempt durably before making it.

        The slot is given back instead (`yielded`) when the pool is now over its
        learned limit: requests that waited out a 429 must not all retry at once
        into an endpoint that has just shown it serves fewer. `number` is None when
        the row is no longer ours (canceled, or taken over while we slept).
        """
        c = requests.c
        with self.engine.begin() as conn:
            if pool_state.over_learned_limit(conn, request.endpoint):
                gave_back = conn.execute(
                    update(requests)
                    .where(self._fenced(request))
                    .values(
                        status=QUEUED,
                        lease_owner=None,
                        lease_expires_at=None,
                        next_attempt_at=db_now(),
                        updated_at=db_now(),
                    )
                ).rowcount
                return NextAttempt(None, self._active(conn), time.time(), yielded=bool(gave_back))
            number = conn.execute(
                update(requests)
                .where(self._fenced(request))
                .values(attempts=c.attempts + 1, updated_at=db_now())
                .returning(c.attempts, c.lease_owner)
            ).first()
            if number is None:
                return NextAttempt(None, self._active(conn), time.time())
            conn.execute(
                insert(attempts).values(started_at=db_now()),
                {
                    "request_id": request.id,
                    "attempt": number.attempts,
                    "worker": number.lease_owner,
                    "outcome": AttemptOutcome.RUNNING.value,
                },
            )
            return NextAttempt(int(number.attempts), 0, 0.0)

    # -- leases ----------------------------------------------------------------

    def retire_worker(self, worker: str) -> None:
        """A daemon that stops cleanly leaves the registry, so the others' shares grow at once."""
        with self.engine.begin() as conn:
            conn.execute(workers.delete().where(workers.c.worker_id == worker))

    def renew_leases(self, worker: str, lease_seconds: float) -> int:
        """Heartbeat (for fair shares) and extend every lease this worker holds."""
        with self.engine.begin() as conn:
            conn.execute(self.dialect.upsert(workers, ["worker_id"], {"worker_id": worker}, {"heartbeat_at": db_now()}))
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
                    select(c.id).where(c.delivery == Delivery.ONLINE.value, c.status.in_([QUEUED, RUNNING])).limit(1)
                ).first()
                is not None
            )
