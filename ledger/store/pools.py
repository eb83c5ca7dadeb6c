"""Shared endpoint-pool state: 429 cooldowns and the learned (adaptive) limit.

Every daemon reads this in its claim transaction, so what one process learns
about an endpoint holds back all of them:
- a 429 with `retry-after` cools the whole pool down until then;
- every retryable 429 lowers the pool's *learned limit* by one, starting from
  the number of its requests in flight, so a pool configured above what the
  provider really serves converges to what it serves instead of collecting 429s;
- `PROBE_ROUNDS x learned_limit` successes in a row, and at least `probe_seconds`
  since the limit last changed, raise it by one again, until it reaches the
  configured limit and is dropped (additive increase). Probing is rare on purpose:
  a probe that finds the ceiling costs a whole-pool cooldown (the 429's
  retry-after), so probing every few rounds would halve the pool's throughput.
Called only from `Store` methods, inside their transactions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.engine import Connection

from ledger.models import LlmPool, LlmRequest, RequestStatus
from ledger.store.dialect import Dialect, db_now, db_now_plus

# Rounds of full-limit successes before trying one more slot.
PROBE_ROUNDS = 10

pools = LlmPool.__table__  # type: ignore[attr-defined]
requests = LlmRequest.__table__  # type: ignore[attr-defined]

_STATE = select(pools.c.endpoint, pools.c.cooldown_until > db_now(), pools.c.learned_limit).where(
    or_(pools.c.cooldown_until > db_now(), pools.c.learned_limit.is_not(None))
)


def read_state(conn: Connection, configured: Callable[[str], int]) -> tuple[set[str], dict[str, int]]:
    """(pools cooling down, effective learned limits); learned limits that grew back are dropped."""
    cooling: set[str] = set()
    learned: dict[str, int] = {}
    recovered: list[str] = []
    for endpoint, is_cooling, limit in conn.execute(_STATE):
        if is_cooling:
            cooling.add(endpoint)
        if limit is not None:
            if limit >= configured(endpoint):
                recovered.append(endpoint)
            else:
                learned[endpoint] = int(limit)
    if recovered:
        conn.execute(update(pools).where(pools.c.endpoint.in_(recovered)).values(learned_limit=None, successes=0))
    return cooling, learned


def note_rate_limited(
    conn: Connection, dialect: Dialect, endpoint: str, count: int = 1, cooldown_s: float | None = None
) -> None:
    """`count` 429s from `endpoint`: lower its learned limit by that many; cool it down if told how long.

    One statement, read and write together: two daemons noting a 429 at the same
    moment each take their decrement (a read followed by a write would lose one).
    A pool with no learned limit yet starts from the requests it has in flight.
    """
    running = _running_in_sql(endpoint)
    lowered = _at_least_one(func.coalesce(pools.c.learned_limit, running) - count)
    values: dict[str, Any] = {"successes": 0, "updated_at": db_now()}
    first: dict[str, Any] = {"endpoint": endpoint, "learned_limit": _at_least_one(running - count)}
    on_conflict: dict[str, Any] = {"learned_limit": lowered}
    if cooldown_s:
        until = db_now_plus(cooldown_s)
        first["cooldown_until"] = until
        # A shorter retry-after seen by another daemon never cuts a longer cooldown short.
        on_conflict["cooldown_until"] = case((pools.c.cooldown_until > until, pools.c.cooldown_until), else_=until)
    conn.execute(dialect.upsert(pools, ["endpoint"], first, values, on_conflict=on_conflict))


def _at_least_one(expr: Any) -> Any:
    return case((expr < 1, 1), else_=expr)


def _running_in_sql(endpoint: str) -> Any:
    return (
        select(func.count())
        .where(requests.c.endpoint == endpoint, requests.c.status == RequestStatus.RUNNING.value)
        .scalar_subquery()
    )


def note_successes(conn: Connection, endpoints: Iterable[str], probe_seconds: float) -> None:
    """Successes on pools with a learned limit: enough of them in a row, and long enough, add one slot."""
    counts: dict[str, int] = {}
    for endpoint in endpoints:
        counts[endpoint] = counts.get(endpoint, 0) + 1
    for endpoint, n in sorted(counts.items()):
        conn.execute(
            update(pools)
            .where(pools.c.endpoint == endpoint, pools.c.learned_limit.is_not(None))
            .values(successes=pools.c.successes + n)
        )
    conn.execute(
        update(pools)
        .where(
            pools.c.endpoint.in_(list(counts)),
            pools.c.successes >= pools.c.learned_limit * PROBE_ROUNDS,
            pools.c.updated_at <= db_now_plus(-probe_seconds),
        )
        .values(learned_limit=pools.c.learned_limit + 1, successes=0, updated_at=db_now())
    )


def over_learned_limit(conn: Connection, endpoint: str) -> bool:
    """More of the pool's requests in flight than its learned limit allows."""
    row = conn.execute(
        select(pools.c.learned_limit, _running_in_sql(endpoint)).where(pools.c.endpoint == endpoint)
    ).first()
    return row is not None and row[0] is not None and int(row[1]) > int(row[0])
