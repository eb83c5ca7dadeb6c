"""The learned pool limit: a 429 lowers it in one step, long runs of successes raise it back (both databases).

The daemon-level tests run a real daemon against the mock provider through the OpenAI SDK.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest

from adapters.mock_provider import mock_provider_process
from ledger.daemon import run_daemon
from ledger.enqueue import build_spec, to_row
from ledger.executor import CallContext
from ledger.prices import PriceTable
from ledger.record import DbLane, Recorder
from ledger.retry import RetryPolicy
from ledger.scheduler import Scheduler
from ledger.settings import load_settings
from ledger.store import Store
from ledger.store.pool_lessons import PROBE_ROUNDS
from ledger.store.rows import AttemptFailure, ClaimedRequest, Completed, Outcome, RetryLater
from tests.integration.store_helpers import add_requests

RATE_LIMITED = AttemptFailure(429, "rate_limit_error", "too many in flight", 3)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    add_requests(s, 400, prefix="r")
    yield s
    s.close()


def claim(store: Store, n: int = 8, limit: int = 8) -> list[ClaimedRequest]:
    return store.claim(
        "w", lease_seconds=30, global_limit=limit, pool_limit=lambda _: limit, max_attempts=5, max_claims=n
    ).requests


def learned(store: Store) -> int | None:
    return store.pool_usage().get("mock:m", {}).get("learned_limit")


def test_a_group_of_429s_is_one_lesson_from_what_was_in_flight(store: Store) -> None:
    """Not counted by the caller: the calls still open in the database are what the provider serves."""
    held = claim(store)
    assert len(held) == 8
    store.record([RetryLater(r, 1, RATE_LIMITED, delay_s=0.0) for r in held[:5]])
    assert learned(store) == 3  # 8 in flight, 5 rejected: the provider serves 3
    store.record([Completed(r, 1, "ok", 5) for r in held[5:]])
    assert claim(store) == []  # 5 holders still occupy more than the 3 learned slots


def test_a_429_sets_the_limit_in_one_step_to_the_calls_out_when_it_was_refused(store: Store) -> None:
    """Refused while 5 of our calls were out: the provider serves 5, whatever else was claimed
    since. One 429, one step to 5 (a decrement per 429 would have taken 12 - 1 = 11)."""
    held = claim(store, 12, limit=16)
    assert len(held) == 12
    store.record([RetryLater(held[5], 1, RATE_LIMITED, delay_s=0.0, hold_slot=False, calls_out=5)])
    assert learned(store) == 5


def test_a_burst_of_429s_sets_the_limit_once_not_once_per_429(store: Store) -> None:
    """16 sent, 8 served: the 8 refusals each counted the calls out when they came (the last one
    8, the first 15). The limit is 8, not 16 - 8 decrements nor collapsed towards 1."""
    held = claim(store, 16, limit=16)
    refused: list[Outcome] = [
        RetryLater(r, 1, RATE_LIMITED, delay_s=0.0, hold_slot=False, calls_out=15 - i) for i, r in enumerate(held[8:])
    ]
    store.record(refused[:3])  # the first refusals, recorded before the rest came back
    assert learned(store) == 13  # at most the 13 still out then
    store.record(refused[3:])
    assert learned(store) == 8
    assert len(claim(store, 16, limit=16)) == 0  # 8 still running: the pool is full at 8


def test_other_daemons_calls_count_as_they_are_in_the_database(store: Store) -> None:
    ours = claim(store, 4, limit=16)
    theirs = store.claim(
        "w2", lease_seconds=30, global_limit=16, pool_limit=lambda _: 16, max_attempts=5, max_claims=3
    ).requests
    assert len(theirs) == 3
    store.record([RetryLater(ours[0], 1, RATE_LIMITED, delay_s=0.0, hold_slot=False, calls_out=3)])
    assert learned(store) == 3 + 3  # our 3 other calls out, and the other daemon's 3


def test_a_429_alone_at_the_provider_cools_the_pool_down_instead(store: Store) -> None:
    """Nothing else in flight: no lesson about concurrency; its retry-after holds the pool."""
    (only,) = claim(store, 1)
    store.record([RetryLater(only, 1, RATE_LIMITED, 5.0, hold_slot=False, pool_cooldown_s=5.0, calls_out=0)])
    assert learned(store) is None
    assert store.pool_usage()["mock:m"]["cooldown_until"] is not None
    assert claim(store) == []


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


@pytest.mark.timing  # how many 429s a limit is learned in: run alone (see the test command)
@pytest.mark.parametrize("cap", [4])
def test_a_daemon_learns_the_providers_concurrency_from_its_first_429s(db_url: str, cap: int) -> None:
    """Limit 12 against a provider serving 4: slow start stops at the first refusal, the limit is
    learned from it in one step, and nothing more is refused afterwards."""
    n = 40
    with mock_provider_process("--latency", "0.1", "--max-concurrency", str(cap)) as mock:
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=db_url,
            MAX_CONCURRENT_LLM_CALLS=12,
            OPENAI_BASE_URL=mock.openai_base_url,
            OPENAI_API_KEY="k",
            RETRY_MAX_ATTEMPTS=5,
            RETRY_INITIAL_DELAY=0.05,
            RETRY_MAX_DELAY=1,
        )
        store = Store(db_url)
        store.enqueue(
            to_row(build_spec(model="gpt-4o-mini", idempotency_key=f"c{i}", messages=[ask(i)])) for i in range(n)
        )
        anyio.run(lambda: run_daemon(settings, until_idle=True, handle_signals=False))
        stats = mock.stats()
    usage = store.pool_usage()["openai:gpt-4o-mini"]
    counts = store.status_counts()
    store.close()
    assert counts["completed"] == n
    assert usage["learned_limit"] == cap
    assert stats["max_in_flight"] == cap
    assert stats["status_counts"].get("429", 0) <= 3


def ask(i: int) -> dict[str, str]:
    return {"role": "user", "content": f"capacity probe {i}"}


def test_a_claim_leaves_alone_a_pool_whose_refusal_is_on_its_way(store: Store) -> None:
    """A 429 handed in and not yet written: its lesson is not in the database, so the claim
    made meanwhile (a group commit's refill, a slow-start step) opens nothing in that pool,
    and other pools go on."""
    add_requests(store, 4, model="n")
    limits = {"lease_seconds": 30, "global_limit": 8, "pool_limit": lambda _: 8, "max_attempts": 5, "max_claims": 8}
    taken = store.claim("w", **limits, hold=["mock:m"]).requests
    assert sorted(r.endpoint for r in taken) == ["mock:n"] * 4
    # A group commit's own claim (the refill of what it freed) holds the pool the same way.
    recorded = store.record([Completed(taken[0], 1, "ok", 5)], claim_for="w", **limits, hold=["mock:m"])
    assert recorded.claim is not None and recorded.claim.requests == []
    recorded = store.record([Completed(taken[1], 1, "ok", 5)], claim_for="w", **limits)
    assert recorded.claim is not None and [r.endpoint for r in recorded.claim.requests] == ["mock:m"] * 6


def test_a_refusal_in_hand_holds_its_pool_out_of_claims_until_it_is_written(store: Store) -> None:
    held = claim(store, 3)
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=str(store.engine.url))

    async def run() -> None:
        lane = DbLane()
        recorder = Recorder(store, lane, on_slot_freed=lambda _: None)
        ctx = CallContext(store, lane, recorder, RetryPolicy(0.1, 1.0, 5), 10.0, PriceTable({}))
        scheduler = Scheduler(ctx, settings, "w")
        busy = threading.Event()
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            tg.start_soon(lane.run, busy.wait)  # the lane is busy: what is handed in waits
            refused = RetryLater(held[0], 1, RATE_LIMITED, delay_s=0.0, hold_slot=False, calls_out=2)
            tg.start_soon(recorder.submit, refused)
            tg.start_soon(recorder.submit, Completed(held[1], 1, "ok", 5))
            await anyio.wait_all_tasks_blocked()
            try:  # handed in, not written: the next claim leaves the pool alone
                assert recorder.refusals_in_hand() == {"mock:m"}
                assert scheduler.limits_now()["hold"] == {"mock:m"}
            finally:
                busy.set()
            with anyio.fail_after(30):
                while recorder.in_hand():
                    await anyio.sleep(0.01)
            assert recorder.refusals_in_hand() == set()
            assert "hold" not in scheduler.limits_now()  # written: the lesson itself holds the pool now
            tg.cancel_scope.cancel()

    anyio.run(run)
    assert learned(store) == 2
