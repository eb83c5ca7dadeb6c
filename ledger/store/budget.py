"""What a claim (or a provider batch's attach) may still reserve: today's budget and each job's.

Spend = the cost of what finished (today, or in the job) + the estimates reserved by calls in
flight; a request that does not fit waits in the queue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.engine import Connection

from ledger.statuses import RequestStatus
from ledger.store.dialect import db_today
from ledger.store.tables import jobs, requests

_c = requests.c
RUNNING = RequestStatus.RUNNING.value


@dataclass
class Budget:
    """What the claim may still reserve: today's cap and each candidate job's own cap.

    Read under the ledger's turn alone (a daily budget) or the job's turn (its own budget), so
    what several daemons reserve together never passes a cap: spent = the cost of what
    finished (today, or in the job) + the estimates reserved by calls in flight. A request
    that does not fit waits in the queue. Requests without an estimate (no price known) are
    not held back.
    """

    daily_left: float | None
    job_left: dict[str, float]

    @classmethod
    def read(
        cls,
        conn: Connection,
        daily_budget: float | None,
        candidates: list[Any],
        caps: dict[str, float | None],
        turns: Callable[[list[str]], set[str]] | None = None,
    ) -> Budget:
        """`caps` (job id -> its budget_usd) is the caller's cache: a job's budget is fixed when
        it is staged, so each job is looked up once per process, not on every claim. `turns`
        (a claim's): takes the capped jobs' turns before their spend is read, answering those
        held; a job whose turn another claim holds gets nothing from this one."""
        priced = [r for r in candidates if r.estimate_usd is not None]
        if not priced:
            return cls(None, {})
        daily_left = None if daily_budget is None else daily_budget - spent_today(conn)
        unknown = sorted({r.job_id for r in priced if r.job_id is not None} - caps.keys())
        if unknown:
            query = select(jobs.c.id, jobs.c.budget_usd).where(jobs.c.id.in_(unknown))
            found: dict[str, float | None] = {row.id: row.budget_usd for row in conn.execute(query)}
            caps.update({job_id: found.get(job_id) for job_id in unknown})
        capped = sorted({r.job_id for r in priced if r.job_id is not None and caps.get(r.job_id) is not None})
        mine = set(capped) if turns is None or not capped else turns(capped)
        job_left = {
            job_id: float(caps[job_id] or 0.0) - job_spent(conn, job_id) if job_id in mine else -math.inf
            for job_id in capped
        }
        return cls(daily_left, job_left)

    def affordable(self, rows: list[Any]) -> list[Any]:
        """The rows (id, job_id, estimate_usd) that fit, in order, each reserved as it is taken."""
        return [row for row in rows if self.reserve(row.job_id, row.estimate_usd)]

    def reserve(self, job_id: str | None, estimate: float | None) -> bool:
        """Take `estimate` from what is left, or say it does not fit."""
        if estimate is None:
            return True
        job_left = self.job_left.get(job_id) if job_id is not None else None
        if (self.daily_left is not None and estimate > self.daily_left) or (
            job_left is not None and estimate > job_left
        ):
            return False
        if self.daily_left is not None:
            self.daily_left -= estimate
        if job_left is not None and job_id is not None:
            self.job_left[job_id] = job_left - estimate
        return True


# Reservations count while their call may be spending: online in flight, or in a provider batch.
_SPENDING = _c.status.in_([RUNNING, RequestStatus.SUBMITTED.value])
_RESERVED = func.coalesce(func.sum(case((_SPENDING, _c.reserved_usd), else_=None)), 0.0)


def spent_today(conn: Connection) -> float:
    """Today's spend (UTC day, the database's clock): costs of what finished today + reservations in flight."""
    finished = func.coalesce(func.sum(case((_c.completed_at >= db_today(), _c.cost_usd), else_=None)), 0.0)
    row = conn.execute(select(finished, _RESERVED).where(or_(_c.completed_at >= db_today(), _SPENDING))).one()
    return float(row[0]) + float(row[1])


def job_spent(conn: Connection, job_id: str) -> float:
    """A job's spend: costs of its finished requests + reservations of its calls in flight."""
    row = conn.execute(select(func.coalesce(func.sum(_c.cost_usd), 0.0), _RESERVED).where(_c.job_id == job_id)).one()
    return float(row[0]) + float(row[1])
