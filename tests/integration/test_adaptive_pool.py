"""The learned pool limit: 429s lower it, long runs of successes raise it back (both databases)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger.enqueue import build_spec, to_row
from ledger.store import Store
from ledger.store.pools import PROBE_ROUNDS
from ledger.store.rows import AttemptFailure, ClaimedRequest, Completed, RetryLater

RATE_LIMITED = AttemptFailure(429, "rate_limit_error", "too many in flight", 3)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.enqueue(
        to_row(
            build_spec(
                model="m", provider="mock", idempotency_key=f"r{i}", messages=[{"role": "user", "content": f"q{i}"}]
            )
        )
        for i in range(400)
    )
    yield s
    s.close()


def claim(store: Store, n: int = 8) -> list[ClaimedRequest]:
    return store.claim(
        "w", lease_seconds=30, global_limit=8, pool_limit=lambda _: 8, max_attempts=5, max_claims=n
    ).requests


def learned(store: Store) -> int | None:
    return store.pool_usage().get("mock:m", {}).get("learned_limit")


def test_each_429_lowers_the_limit_from_what_was_in_flight(store: Store) -> None:
    held = claim(store)
    assert len(held) == 8
    store.record([RetryLater(r, 1, RATE_LIMITED, delay_s=0.0) for r in held[:5]])
    assert learned(store) == 3  # 8 in flight, 5 rejected: the provider serves 3
    store.record([Completed(r, 1, "ok", 5) for r in held[5:]])
    assert claim(store) == []  # 5 holders still occupy more than the 3 learned slots


def test_holders_over_the_learned_limit_give_their_slot_back(store: Store) -> None:
    held = claim(store, 4)
    store.record([RetryLater(r, 1, RATE_LIMITED, delay_s=0.0) for r in held[:2]])
    assert learned(store) == 2
    first, second = (store.begin_attempt(r) for r in held[:2])
    assert first.number is None and first.yielded  # 4 running > 2 learned: give the slot back
    assert second.number is None and second.yielded is True
    assert store.status_counts()["running"] == 2
    store.record([Completed(r, 1, "ok", 5) for r in held[2:]])
    again = claim(store)
    assert len(again) == 2 and {r.id for r in again} == {r.id for r in held[:2]}
    assert all(r.attempt == 2 for r in again)  # the 429 attempt still counts


def learn_a_limit_of_one(store: Store) -> None:
    held = claim(store, 2)
    store.record([RetryLater(held[0], 1, RATE_LIMITED, delay_s=0.0)])
    assert learned(store) == 1
    store.record([Completed(held[1], 1, "ok", 5)])
    assert store.begin_attempt(held[0]).number == 2
    store.record([Completed(held[0], 2, "ok", 5)])


def succeed(store: Store, times: int) -> None:
    for _ in range(times):
        (request,) = claim(store, 1)
        store.record([Completed(request, request.attempt, "ok", 5)])


def test_successes_raise_it_back_and_it_disappears_at_the_configured_limit(store: Store) -> None:
    store.pool_probe_seconds = 0
    learn_a_limit_of_one(store)
    limit = 1
    while limit < 8:
        succeed(store, PROBE_ROUNDS * limit)
        limit += 1
        assert learned(store) in (limit, None)
    claim(store, 8)
    assert learned(store) is None


def test_a_learned_limit_stands_for_the_probe_interval_however_many_successes(store: Store) -> None:
    """A probe that finds the ceiling costs a whole-pool cooldown: not more often than the interval allows."""
    store.pool_probe_seconds = 3600
    learn_a_limit_of_one(store)
    succeed(store, PROBE_ROUNDS * 5)
    assert learned(store) == 1
