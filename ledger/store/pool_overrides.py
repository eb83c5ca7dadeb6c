"""Pool limits changed live (`ledger pools set` / `reset`): stored in the ledger, read by every
claim of every daemon on the database, so a change holds from each one's next claim, with no
restart, and outlives restarts until it is reset.

An override replaces the setting it names (LEDGER_POOL_LIMITS / LEDGER_DEFAULT_POOL_LIMIT for
`concurrency`, LEDGER_POOL_RPM, LEDGER_POOL_TPM) for its pool; what it leaves NULL keeps the
setting. The global limit still caps every pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine

from ledger.store.commit import reading, transaction
from ledger.store.dialect import Dialect, db_now
from ledger.store.pools import PoolRules
from ledger.store.tables import pool_overrides as overrides

_o = overrides.c
_READ = select(_o.endpoint, _o.concurrency, _o.rpm, _o.tpm)


@dataclass(frozen=True)
class PoolOverrides:
    """What a claim applies over the settings: per pool, its slots, RPM and TPM (None: as set)."""

    concurrency: dict[str, int]
    rpm: dict[str, int]
    tpm: dict[str, int]

    def applied(
        self, pool_limit: Callable[[str], int], rules: PoolRules, global_limit: int
    ) -> tuple[Callable[[str], int], PoolRules]:
        """The claim's pool limit and rules with these overrides over them."""
        slots = self.concurrency

        def limit(endpoint: str) -> int:
            own = slots.get(endpoint)
            return pool_limit(endpoint) if own is None else min(own, global_limit)

        if self.rpm or self.tpm:
            rules = replace(rules, rpm={**rules.rpm, **self.rpm}, tpm={**rules.tpm, **self.tpm})
        return limit, rules


# The claim reads the overrides in force with its other state reads (`ClaimQueries._state_reads`):
# on PostgreSQL in the same round trip, where a read of their own was one more per group commit.
READ_OVERRIDES = _READ


def overrides_from(rows: Iterable[Any]) -> PoolOverrides | None:
    """The overrides in force (None: none), from `READ_OVERRIDES`'s rows read inside the claim's
    transaction."""
    rows = list(rows)
    if not rows:
        return None
    return PoolOverrides(
        {e: int(n) for e, n, _, _ in rows if n is not None},
        {e: int(r) for e, _, r, _ in rows if r is not None},
        {e: int(t) for e, _, _, t in rows if t is not None},
    )


class PoolOverrideQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    def set_pool_override(
        self, endpoint: str, *, concurrency: int | None, rpm: int | None, tpm: int | None
    ) -> dict[str, Any]:
        """Store a pool's new limits (those given; the others it had stay). Returns them."""
        given = {k: v for k, v in {"concurrency": concurrency, "rpm": rpm, "tpm": tpm}.items() if v is not None}
        with transaction(self.engine, self.dialect) as conn:
            conn.execute(self.dialect.insert_ignore(overrides, ["endpoint"]), {"endpoint": endpoint})
            conn.execute(update(overrides).where(_o.endpoint == endpoint).values(**given, updated_at=db_now()))
            row = conn.execute(_READ.where(_o.endpoint == endpoint)).one()
        return dict(row._mapping)

    def reset_pool_override(self, endpoint: str) -> bool:
        """Back to the settings; False if the pool had no override."""
        with transaction(self.engine, self.dialect) as conn:
            return bool(conn.execute(delete(overrides).where(_o.endpoint == endpoint)).rowcount)

    def pool_overrides(self) -> dict[str, dict[str, Any]]:
        """Every override: pool -> concurrency, rpm, tpm."""
        with reading(self.engine) as conn:
            return {str(row.endpoint): dict(row._mapping) for row in conn.execute(_READ)}
