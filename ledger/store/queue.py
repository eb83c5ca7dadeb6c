"""The hot path's SQL around the claim (`claim.py`): enqueue, record outcomes, attempts, cancel.

Invariants every statement here keeps:
- Every write to a claimed row carries its fencing token and `status='running'`:
  a worker whose lease was taken over, or whose request was canceled, changes
  nothing (cancel wins over a late completion).
- Times are the database's (`db_now`), never the process's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    and_,
    case,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection

from ledger.statuses import AttemptOutcome, Delivery, RequestStatus
from ledger.store import pool_windows
from ledger.store import pools as pool_state
from ledger.store.cache import CachePolicy, Hit, Resolved, resolve
from ledger.store.claim import QUEUED, RUNNING, START_ATTEMPT, ClaimQueries
from ledger.store.commit import reading, transaction
from ledger.store.dialect import POOL, db_now
from ledger.store.lineage import link_sources
from ledger.store.outcome_writes import OutcomeGroup, cancel_waiting
from ledger.store.rows import (
    ClaimedRequest,
    Outcome,
    PausedPool,
    Recorded,
    Written,
)
from ledger.store.tables import jobs, requests

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


_RUNNING_UNMARKED = and_(requests.c.status == RUNNING, requests.c.cancel_requested_at.is_(None))


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
        the same transaction: one commit per round instead of two. The writer's turn
        is taken *first* (shared: other daemons' group commits do not wait for it),
        and the pools' turns before their rows are written (what answers teach): a
        claimer holding a pool's turn never waits for a row a transaction waiting for
        that turn holds (docs/architecture.md, "Claims without a ledger-wide lock").
        """
        group = OutcomeGroup(outcomes, self.dialect)
        # The claim's reads go with the group's writes when nothing else is written before the
        # claim (no lease sweep, nothing to note about the pools): the usual group.
        reads = None
        if claim_for:  # before the reads: they lock the slots made (`claim_reads`)
            self.make_slots(limits["global_limit"])
        quiet = pool_state.quiet(outcomes, self.pool_rules, self.windowed)
        if claim_for and quiet and not limits.get("reclaim", True) and not self.learning & group.endpoints:
            reads = self.claim_reads(
                claim_for, limits["lease_seconds"], group.freed, limits["global_limit"], group.endpoints
            )
        alone = limits.get("daily_budget") is not None  # spend is one figure: the ledger's turn alone
        with transaction(self.engine, self.dialect) as conn:
            # The turn, the group's updates, its twins and the claim's reads: one round trip on PostgreSQL.
            sent = (*group.updates, *group.twins, *(reads.statements if reads else ()))
            ran = group.results(self.dialect.writer_turn(conn, claim_for, *sent, alone=alone))
            if group.all_matched(ran):
                written = [Written.APPLIED] * len(outcomes)
            else:
                written = group.sort_out(conn)  # which may end rows `canceled`: read after it
                reads = None
            group.write_derived(conn, written)
            # Answers per pool: they count towards probing a learned limit up, and they prove a
            # pool's peak in slow start (the slots they freed were busy until now).
            answered = group.answered(written)
            learning = {endpoint: n for endpoint, n in answered.items() if endpoint in self.learning}
            if not quiet or learning:  # a pool's row is written under its turn only (waited for: none held yet)
                self.dialect.take_turns(conn, [(POOL, endpoint) for endpoint in sorted(group.endpoints)])
            paused = [] if quiet else self._note_pools(conn, outcomes)
            if learning:
                pool_state.note_successes(conn, learning, self.pool_probe_seconds)
            if claim_for:
                read = replace(reads, found=ran.claim_reads) if reads else None
                claim = self.claim_in(conn, claim_for, proven=answered, read=read, **limits)
                active = claim.active_slots - len(claim.requests)
            else:
                claim, active = None, self._active(conn)
            ts = time.time()
        return Recorded(written, active, ts, claim, ran.twins_answered, paused)

    def _note_pools(self, conn: Connection, outcomes: list[Outcome]) -> list[PausedPool]:
        """What the outcomes say about their pools: limits learned (kept for the next claims), pauses."""
        for window in pool_state.note_outcomes(conn, self.dialect, outcomes, self.pool_rules, self.windowed):
            self.pool_rules = self.pool_rules.learned(window)
        return pool_state.pause_pools(conn, self.dialect, outcomes)

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
            ended = cancel_waiting(conn, self.dialect, why)
            return NextAttempt(None, self._active(conn), time.time(), canceled=ended)

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
            self.dialect.serialize_claimers(conn)  # a writer of many rows: the ledger's turn alone (docs)
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
