"""Delivery `auto`'s SQL: the requests whose deadline less the margin has come, taken from the
batch path to the online one.

An `auto` request is stored on the batch path (`delivery = 'batch'`) with its `deadline`.
At `deadline - margin`:
- one still queued for a batch goes online (`delivery = 'online'`), never batched;
- one inside a submitted batch marks that batch (`fallback_at`): the batch worker cancels it
  at the provider, maps what it answered, and takes the rest out of it (`detach`): status
  `queued`, delivery `online`, no batch; their batch attempts end `canceled`
  (`deadline_fallback`), counted for no retry limit.
A request is answered once: a batch result is written only to a request still `submitted` in
that batch, so one that arrives after its request went online is kept on its attempt (its
cost, `answered_late`), never as a second result (`batch_results.py`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func, literal, or_, select, update
from sqlalchemy.engine import Connection, Engine

from ledger.statuses import AttemptOutcome, BatchStatus, Delivery, RequestStatus
from ledger.store.batches import BATCH, SUBMITTED, BatchLease, _fence
from ledger.store.claim import QUEUED
from ledger.store.commit import any_row, reading, transaction
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.tables import attempts, batches, requests

_r, _b, _a = requests.c, batches.c, attempts.c
ONLINE = Delivery.ONLINE.value
FALLBACK = "deadline_fallback"  # the error code of a batch attempt taken back at a deadline
ANSWERED_LATE = "answered_late"  # ... and of one its batch answered after that
# A request moved from the batch path online: out of any batch it was in, and its batch attempts
# so far count for no online retry limit (`parked`: the attempts no limit counts).
_GONE_ONLINE: dict[str, Any] = {
    "delivery": ONLINE,
    "batch_id": None,
    "parked": _r.attempts,
    "updated_at": db_now(),
}


def _open_near(margin: float) -> Any:
    """Requests with a deadline, still open, whose deadline less `margin` has come (the terms of
    the partial index `ix_llm_requests_deadline`, so it is the one read)."""
    return and_(
        _r.deadline.is_not(None),
        _r.status.in_([QUEUED, SUBMITTED]),
        _r.deadline <= db_now_plus(margin),
    )


class DeadlineQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    def deadlines_due(self, margin: float) -> bool:
        """Whether any `auto` request waits for a batch, or sits in one, past its deadline less
        `margin` (read first: most cycles find none and write nothing)."""
        due = select(literal(1)).where(_open_near(margin), or_(_r.status == SUBMITTED, _r.delivery == BATCH))
        return any_row(self.engine, due)

    def auto_online_now(self, margin: float) -> dict[str, int]:
        """Queued `auto` requests not yet in a batch at their deadline less `margin` go online.
        Returns how many per pool."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            pools = conn.execute(
                update(requests)
                .where(_open_near(margin), _r.status == QUEUED, _r.delivery == BATCH)
                .values(**_GONE_ONLINE)
                .returning(_r.endpoint)
            ).scalars()
            return _counted(pools)

    def mark_fallbacks(self, margin: float) -> list[int]:
        """Submitted batches holding an `auto` request at its deadline less `margin`: marked
        (`fallback_at`) and due for a poll now, which cancels them. Returns their ids."""
        with transaction(self.engine, self.dialect, resolvable=True) as conn:
            holding = select(_r.batch_id).distinct().where(_open_near(margin), _r.status == SUBMITTED)
            return [
                int(i)
                for i in conn.execute(
                    update(batches)
                    .where(
                        _b.id.in_(holding.scalar_subquery()),
                        _b.status == BatchStatus.SUBMITTED.value,
                        _b.fallback_at.is_(None),
                    )
                    .values(fallback_at=db_now(), next_poll_at=db_now(), updated_at=db_now())
                    .returning(_b.id)
                ).scalars()
            ]

    def detach_for_deadline(self, lease: BatchLease) -> dict[str, int]:
        """Take the batch's unanswered `auto` requests out of it, online (under its lease).
        Returns how many per pool."""
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.serialize_claimers(conn)  # a writer of many rows: the ledger's turn alone
            _fence(conn, lease)
            return detach(conn, lease.id)


def detach(conn: Connection, batch_id: int) -> dict[str, int]:
    """The batch's `auto` requests still waiting for it go online: queued now, out of the batch,
    their batch attempts ended (`_GONE_ONLINE`). Per pool."""
    waiting = select(_r.id).where(_r.batch_id == batch_id, _r.status == SUBMITTED, _r.deadline.is_not(None))
    conn.execute(
        update(attempts)
        .where(
            _a.request_id.in_(waiting.scalar_subquery()),
            _a.batch_id == batch_id,
            _a.outcome == AttemptOutcome.RUNNING.value,
        )
        .values(
            outcome=AttemptOutcome.CANCELED.value,
            error_code=FALLBACK,
            error_message="taken out of its batch at its deadline less the margin, and called online",
            finished_at=db_now(),
        )
    )
    pools = conn.execute(
        update(requests)
        .where(_r.batch_id == batch_id, _r.status == SUBMITTED, _r.deadline.is_not(None))
        .values(status=QUEUED, reserved_usd=None, next_attempt_at=db_now(), **_GONE_ONLINE)
        .returning(_r.endpoint)
    ).scalars()
    return _counted(pools)


def _counted(pools: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pool in pools:
        counts[pool] = counts.get(pool, 0) + 1
    return counts


# How a completed request was answered: from the response cache, else `answered_via` (a row
# answered before that column existed: its delivery path).
_ANSWERED_VIA = case((_r.cached_from.is_not(None), "cache"), else_=func.coalesce(_r.answered_via, _r.delivery))


class DeliveryReadings:
    """Mixed into `Store`: how a job's requests were answered (read-only)."""

    engine: Engine

    def job_delivery(self, job_id: str) -> dict[str, Any]:
        """A job's earliest deadline (None: no `auto` request), its completed requests by how
        they were answered (`batch`, `online`, `cache`: copied from the response cache), and how
        many were answered after their deadline (`late`)."""
        via = _ANSWERED_VIA
        late = func.sum(case((and_(_r.deadline.is_not(None), _r.completed_at > _r.deadline), 1), else_=0))
        with reading(self.engine) as conn:
            deadline = conn.execute(select(func.min(_r.deadline)).where(_r.job_id == job_id)).scalar()
            rows = conn.execute(
                select(via, func.count(), late)
                .where(_r.job_id == job_id, _r.status == RequestStatus.COMPLETED.value)
                .group_by(via)
            ).all()
        return {
            "deadline": deadline,
            "answered_via": {str(path): int(n) for path, n, _ in rows},
            "late": sum(int(n or 0) for _, _, n in rows),
        }

    def job_costs(self, job_id: str) -> list[dict[str, Any]]:
        """What a job's answers cost, per provider, model and path (`batch`, `online`, and `late`:
        batch answers that came after their request had gone online, kept on their attempts)."""
        path = _ANSWERED_VIA
        answered = (
            select(_r.provider, _r.model, path, func.coalesce(func.sum(_r.cost_usd), 0.0))
            .where(_r.job_id == job_id, _r.cost_usd.is_not(None), _r.cached_from.is_(None))
            .group_by(_r.provider, _r.model, path)
        )
        late = (
            select(_r.provider, _r.model, literal("late"), func.coalesce(func.sum(_a.cost_usd), 0.0))
            .select_from(attempts.join(requests, _a.request_id == _r.id))
            .where(_r.job_id == job_id, _a.cost_usd.is_not(None))
            .group_by(_r.provider, _r.model)
        )
        with reading(self.engine) as conn:
            found = [*conn.execute(answered).all(), *conn.execute(late).all()]
        return [{"provider": p, "model": m, "path": str(k), "cost_usd": float(c)} for p, m, k, c in found]
