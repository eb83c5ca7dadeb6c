"""The one read an estimate makes (`ledger enqueue --estimate`, `ledger eval --estimate`): which
cache keys the ledger already holds an answer for. Writes nothing."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.engine import Engine

from ledger.store.cache import NO_AGE_LIMIT_DAYS, _is_source
from ledger.store.commit import reading
from ledger.store.dialect import db_now_plus
from ledger.store.tables import requests

_r = requests.c
KEYS_PER_READ = 1000


class EstimateQueries:
    """Mixed into `Store`; needs `engine`."""

    engine: Engine

    def answered_keys(self, keys: Iterable[str], max_age_days: float | None) -> set[str]:
        """The cache keys among `keys` with a source (an original answer worth copying, no older
        than `max_age_days`): an enqueue of their requests would be answered from the cache."""
        wanted = sorted(set(keys))
        age = -float(max_age_days if max_age_days is not None else NO_AGE_LIMIT_DAYS) * 86400.0
        found: set[str] = set()
        with reading(self.engine) as conn:
            for start in range(0, len(wanted), KEYS_PER_READ):
                query = select(_r.cache_key).where(
                    _r.cache_key.in_(wanted[start : start + KEYS_PER_READ]),
                    _is_source(_r),
                    _r.completed_at >= db_now_plus(age),
                )
                found.update(str(key) for key in conn.execute(query).scalars())
        return found
