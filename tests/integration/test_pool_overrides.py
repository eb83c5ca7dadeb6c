"""Pool limits set live (`llm_pool_overrides`) as a claim applies them, on both databases: over the
settings, from the very next claim, and gone with a reset."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger.store import Store
from ledger.store.pools import PoolRules
from tests.integration.store_helpers import add_requests

POOL = "mock:m"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()


def claimed(store: Store, worker: str, limit: int = 10) -> int:
    result = store.claim(
        worker, lease_seconds=30, global_limit=limit, pool_limit=lambda _: limit, max_attempts=3, max_claims=limit
    )
    return len(result.requests)


def test_a_concurrency_set_live_holds_at_the_next_claim_of_every_claimer_until_reset(store: Store) -> None:
    add_requests(store, 30)
    store.set_pool_override(POOL, concurrency=3, rpm=None, tpm=None)
    assert claimed(store, "w1") == 3
    assert claimed(store, "w2") == 0  # another daemon: the pool is full at its new limit
    assert store.reset_pool_override(POOL) is True
    assert claimed(store, "w2") == 7  # back to the settings (10)
    assert store.reset_pool_override(POOL) is False


def test_an_rpm_set_live_caps_the_calls_started_in_the_window_and_keeps_what_it_did_not_name(store: Store) -> None:
    add_requests(store, 30)
    store.pool_rules = PoolRules(tpm={POOL: 10_000_000}, window_s=30)
    store.set_pool_override(POOL, concurrency=None, rpm=4, tpm=None)
    assert store.pool_overrides() == {POOL: {"endpoint": POOL, "concurrency": None, "rpm": 4, "tpm": None}}
    assert claimed(store, "w1") == 4
    store.set_pool_override(POOL, concurrency=8, rpm=None, tpm=None)  # rpm stays 4
    assert store.pool_overrides()[POOL]["rpm"] == 4
    assert claimed(store, "w2") == 0  # the window holds 4 calls already
