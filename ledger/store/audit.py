"""Read-only queries behind `ledger requests`, `show`, `export` and `status`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, column, func, select, table
from sqlalchemy.engine import Engine

from ledger.models import BATCH_AUDIT_VIEW
from ledger.statuses import AttemptOutcome, Delivery, RequestStatus
from ledger.store import cache, tables
from ledger.store.commit import reading
from ledger.store.dialect import db_now, seconds_between
from ledger.store.tables import attempts, pools, requests

LIST_COLUMNS = (
    "id",
    "idempotency_key",
    "job_id",
    "provider",
    "model",
    "status",
    "attempts",
    "last_status_code",
    "input_tokens",
    "output_tokens",
    "latency_ms",
    "created_at",
)


@dataclass(frozen=True)
class LedgerCounts:
    """What the ledger holds at one moment, for the gauges every daemon serves alike."""

    requests: dict[tuple[str, str], int]  # (endpoint, status) -> requests
    due: dict[str, int]  # endpoint -> online requests queued and due now
    learned_limits: dict[str, int]  # endpoint -> learned limit, where one stands
    cache_hits: dict[str, int] = field(default_factory=dict)  # endpoint -> requests answered from the cache


class AuditQueries:
    """Mixed into `Store`; needs `engine`."""

    engine: Engine

    def list_requests(
        self, *, status: str | None = None, job_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        query = select(*(requests.c[name] for name in LIST_COLUMNS)).order_by(requests.c.id).limit(limit)
        if status is not None:
            query = query.where(requests.c.status == status)
        if job_id is not None:
            query = query.where(requests.c.job_id == job_id)
        with reading(self.engine) as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def get_request(self, request_id: int) -> dict[str, Any] | None:
        """The request with every column, and its attempts in order."""
        with reading(self.engine) as conn:
            row = conn.execute(select(requests).where(requests.c.id == request_id)).first()
            if row is None:
                return None
            found = dict(row._mapping)
            found["attempt_rows"] = [
                dict(a._mapping)
                for a in conn.execute(
                    select(attempts).where(attempts.c.request_id == request_id).order_by(attempts.c.attempt)
                )
            ]
            return found

    def export_rows(
        self, *, job_id: str | None = None, chunk: int = 1000, with_response: bool = False
    ) -> Iterator[dict[str, Any]]:
        """Stream requests in id order, a chunk per query, so a big job never sits in memory. The
        provider's body (`response`, the largest column) is read only `with_response`."""
        last_id = 0
        columns = [c for c in requests.c if with_response or c.name != "response"]
        while True:
            query = select(*columns).where(requests.c.id > last_id).order_by(requests.c.id).limit(chunk)
            if job_id is not None:
                query = query.where(requests.c.job_id == job_id)
            with reading(self.engine) as conn:
                rows = [dict(row._mapping) for row in conn.execute(query)]
            if not rows:
                return
            yield from rows
            last_id = rows[-1]["id"]

    def cache_hits_today(self) -> tuple[int, float]:
        """Requests answered from the response cache today (UTC), and what their sources cost."""
        with reading(self.engine) as conn:
            return cache.hits_today(conn)

    def status_counts(self, job_id: str | None = None) -> dict[str, int]:
        query = select(requests.c.status, func.count()).group_by(requests.c.status)
        if job_id is not None:
            query = query.where(requests.c.job_id == job_id)
        with reading(self.engine) as conn:
            counts = {status.value: 0 for status in RequestStatus}
            counts.update({status: int(n) for status, n in conn.execute(query).all()})
            return counts

    def cancel_pending(self, job_id: str | None = None) -> int:
        """Running requests whose cancel waits for their call to return (they still hold a slot)."""
        return self._count_requests(
            job_id, requests.c.status == RequestStatus.RUNNING.value, requests.c.cancel_requested_at.is_not(None)
        )

    def unpriced_count(self, job_id: str | None = None) -> int:
        """Completed requests whose model the price table does not know: their cost_usd is empty."""
        return self._count_requests(
            job_id, requests.c.status == RequestStatus.COMPLETED.value, requests.c.cost_usd.is_(None)
        )

    def _count_requests(self, job_id: str | None, *where: Any) -> int:
        query = select(func.count()).select_from(requests).where(*where)
        if job_id is not None:
            query = query.where(requests.c.job_id == job_id)
        with reading(self.engine) as conn:
            return int(conn.execute(query).scalar_one())

    def list_batches(self, limit: int = 100) -> list[dict[str, Any]]:
        """Provider batches, newest first, from the `llm_batch_audit` view, with their age in seconds."""
        view = table(
            BATCH_AUDIT_VIEW,
            *(
                column(name)
                for name in (
                    "id",
                    "provider",
                    "model",
                    "job_id",
                    "status",
                    "provider_status",
                    "provider_batch_id",
                    "request_total",
                    "completed",
                    "failed",
                    "cost_usd",
                    "turnaround_s",
                )
            ),
        )
        batches_t = tables.batches
        query = (
            select(view, batches_t.c.created_at)
            .join(batches_t, batches_t.c.id == view.c.id)
            .order_by(view.c.id.desc())
            .limit(limit)
        )
        with reading(self.engine) as conn:
            now = conn.execute(select(db_now())).scalar_one()
            found = []
            for row in conn.execute(query):
                item = dict(row._mapping)
                created = item.pop("created_at")
                item["age_s"] = round(seconds_between(created, now), 1)
                found.append(item)
            return found

    def attempt_count(self) -> int:
        with reading(self.engine) as conn:
            return int(conn.execute(select(func.count()).select_from(attempts)).scalar_one())

    def work_by_worker(self) -> dict[str, dict[str, int]]:
        """Per daemon (worker id): requests it answered, and requests it took over from a daemon
        whose lease lapsed (the attempt before its own was `lost` under another worker)."""
        a, before = attempts.alias("a"), attempts.alias("before")
        took_over = (
            select(before.c.id)
            .where(
                before.c.request_id == a.c.request_id,
                before.c.attempt == a.c.attempt - 1,
                before.c.outcome == AttemptOutcome.LOST.value,
                before.c.worker != a.c.worker,
            )
            .exists()
        )
        answered = func.sum(case((a.c.outcome == AttemptOutcome.SUCCEEDED.value, 1), else_=0))
        takeovers = func.sum(case((took_over, 1), else_=0))
        with reading(self.engine) as conn:
            rows = conn.execute(select(a.c.worker, answered, takeovers).group_by(a.c.worker).order_by(a.c.worker))
            return {str(w): {"answered": int(n or 0), "takeovers": int(t or 0)} for w, n, t in rows}

    def pool_usage(self) -> dict[str, dict[str, Any]]:
        """Per endpoint: running (busy slots), queued, cooldown end if cooling down, learned limit."""
        c = requests.c
        with reading(self.engine) as conn:
            usage: dict[str, dict[str, Any]] = {}
            for endpoint, status, n in conn.execute(
                select(c.endpoint, c.status, func.count())
                .where(c.status.in_([RequestStatus.RUNNING.value, RequestStatus.QUEUED.value]))
                .group_by(c.endpoint, c.status)
            ):
                usage.setdefault(endpoint, _empty_pool())[status] = int(n)
            for endpoint, until, cooling, learned, paused in conn.execute(
                select(
                    pools.c.endpoint,
                    pools.c.cooldown_until,
                    pools.c.cooldown_until > db_now(),
                    pools.c.learned_limit,
                    pools.c.paused_reason,
                )
            ):
                pool = usage.setdefault(endpoint, _empty_pool())
                pool["cooldown_until"] = until if cooling else None
                pool["learned_limit"] = learned
                # Paused (a spent quota): until the cooldown ends, then one request probes.
                pool["paused_until"] = until if paused is not None and cooling else None
                pool["paused_reason"] = paused if paused is not None and cooling else None
            return usage

    def ledger_counts(self) -> LedgerCounts:
        """Requests per pool and status, what waits only for a slot, and the learned limits.

        One transaction, so the numbers agree with each other. The per-status count reads
        the (status, endpoint) index only; it is what a metrics reading costs, paid once per
        LEDGER_METRICS_INTERVAL by each daemon serving metrics (on SQLite it holds the file's
        write lock meanwhile, as every transaction there does).
        """
        c = requests.c
        due = (
            select(c.endpoint, func.count())
            .where(
                c.status == RequestStatus.QUEUED.value,
                c.delivery == Delivery.ONLINE.value,
                c.next_attempt_at <= db_now(),
            )
            .group_by(c.endpoint)
        )
        with reading(self.engine) as conn:
            by_status = conn.execute(select(c.endpoint, c.status, func.count()).group_by(c.endpoint, c.status))
            counts = {(str(endpoint), str(status)): int(n) for endpoint, status, n in by_status}
            ready = {str(endpoint): int(n) for endpoint, n in conn.execute(due)}
            learned = {
                str(endpoint): int(limit)
                for endpoint, limit in conn.execute(
                    select(pools.c.endpoint, pools.c.learned_limit).where(pools.c.learned_limit.is_not(None))
                )
            }
            hits = cache.hits_by_pool(conn)
        return LedgerCounts(counts, ready, learned, hits)


def _empty_pool() -> dict[str, Any]:
    return {
        "running": 0,
        "queued": 0,
        "cooldown_until": None,
        "learned_limit": None,
        "paused_until": None,
        "paused_reason": None,
    }
