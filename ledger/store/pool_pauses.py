"""A pool paused because its account's quota or balance is spent: no daemon claims it until
the pause ends, then one request probes (`pool_lessons.note_successes` ends the pause).

Split from `pools.py`: a pause is the provider's word about the account, not a lesson
about the pool's limits.
Called only from `Store` methods, inside their transactions.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import case, select, update
from sqlalchemy.engine import Connection

from ledger.models import LlmPool
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.rows import Outcome, PausedPool, RetryLater

pools = LlmPool.__table__  # type: ignore[attr-defined]


# Pools paused now: nothing of theirs is claimed (their cooldown) until the pause ends.
PAUSED_POOLS = select(pools.c.endpoint).where(pools.c.paused_reason.is_not(None), pools.c.cooldown_until > db_now())


def pause_pools(conn: Connection, dialect: Dialect, outcomes: Iterable[Outcome]) -> list[PausedPool]:
    """Pause the pools whose account's quota or balance a group's outcomes say is spent: no daemon
    claims them until the pause ends (their cooldown), then one request probes (learned limit 1)
    and its answer ends the pause (`note_successes`) or a refusal starts another. Returns the
    pools that were not paused before: each pause is announced once, not once per request."""
    asked: dict[str, tuple[str, RetryLater]] = {}
    for o in outcomes:
        if isinstance(o, RetryLater) and o.pause is not None:
            asked.setdefault(o.request.endpoint, (o.pause.reason, o))
    paused = []
    for endpoint, (reason, o) in sorted(asked.items()):
        was = conn.execute(select(pools.c.endpoint).where(pools.c.endpoint == endpoint, *_PAUSED_NOW)).first()
        assert o.pause is not None
        until = db_now_plus(o.pause.seconds)
        later = case((pools.c.cooldown_until > until, pools.c.cooldown_until), else_=until)
        values = {"paused_reason": reason[:300], "learned_limit": 1, "successes": 0, "updated_at": db_now()}
        first = {"endpoint": endpoint, "cooldown_until": until}
        conn.execute(dialect.upsert(pools, ["endpoint"], first, values, on_conflict={"cooldown_until": later}))
        if was is None:
            ends = conn.execute(select(pools.c.cooldown_until).where(pools.c.endpoint == endpoint)).scalar_one()
            paused.append(PausedPool(endpoint, o.request.provider, reason, ends))
    return paused


_PAUSED_NOW = (pools.c.paused_reason.is_not(None), pools.c.cooldown_until > db_now())


def resume_pool(conn: Connection, endpoint: str) -> bool:
    """Lift a pool's pause at once (`ledger pools resume`); False when it was not paused."""
    return bool(
        conn.execute(
            update(pools)
            .where(pools.c.endpoint == endpoint, pools.c.paused_reason.is_not(None))
            .values(paused_reason=None, cooldown_until=None, learned_limit=None, successes=0, updated_at=db_now())
        ).rowcount
    )
