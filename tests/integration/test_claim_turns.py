"""Claims without a ledger-wide lock (PostgreSQL): a claim waits only for claims of its own pools,
and the global limit holds across pools claimed side by side (the slots)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from ledger.store import Store
from ledger.store.claim import ClaimQueries
from ledger.store.rows import Claim, ClaimedRequest, Completed
from tests.integration.store_helpers import add_requests
from tests.integration.test_lease_endings import in_thread


def limits(global_limit: int, only: str | None = None) -> dict[str, Any]:
    """Claim arguments; `only`: the one pool this claimer may take from (the others are full to it)."""
    pool: Callable[[str], int] = lambda ep: global_limit if only is None or ep == only else 0  # noqa: E731
    return {
        "lease_seconds": 30,
        "global_limit": global_limit,
        "pool_limit": pool,
        "max_attempts": 3,
        "max_claims": global_limit,
    }


def test_a_claim_in_progress_keeps_no_other_claim_waiting_and_its_pool_limit_holds(pg_url: str) -> None:
    """One daemon is inside a claim of pool a (2 of its 3 slots taken, not committed): another
    daemon's claim completes meanwhile, without waiting, and takes pool a's last slot and pool b's
    requests; once both committed, pool a has exactly its limit in flight."""
    first, other = Store(pg_url), Store(pg_url)
    add_requests(first, 20, model="a")
    add_requests(first, 2, model="b")
    per_pool = {**limits(10), "pool_limit": lambda _: 3}
    first.make_slots(10)
    with first.engine.connect() as conn, conn.begin():
        first.dialect.writer_turn(conn, "w1")
        assert len(first.claim_in(conn, "w1", **{**per_pool, "max_claims": 2}).requests) == 2
        thread, box = in_thread(lambda: other.claim("w2", **per_pool))
        thread.join(timeout=30)
        finished_while_held = not thread.is_alive()
    thread.join(timeout=30)
    assert finished_while_held, "a claim waited for another claim in progress"
    assert isinstance(box[0], Claim)
    taken = sorted(r.endpoint for r in box[0].requests)
    assert taken == ["mock:a", "mock:b", "mock:b"]  # pool a's last slot, and pool b's requests
    with first.engine.connect() as conn:
        running = dict(
            conn.execute(text("SELECT endpoint, count(*) FROM llm_requests WHERE status = 'running' GROUP BY 1")).all()
        )
    assert running == {"mock:a": 3, "mock:b": 2}
    for s in (first, other):
        s.close()


def test_claims_for_two_pools_side_by_side_never_pass_the_global_limit(pg_url: str) -> None:
    """A claim for pool a has taken the whole global limit and not committed yet; a claim for pool
    b, in the same moment, counts none of it (not committed), yet takes nothing: the slots are
    taken. Once the first commits the limit is full; once it rolls back, b gets them all."""
    first, second = Store(pg_url), Store(pg_url)
    add_requests(first, 20, model="a")  # the first claim's candidates (locked as read) are all pool a's
    add_requests(first, 6, model="b")
    for commit in (True, False):
        first.make_slots(3)
        with first.engine.connect() as conn, conn.begin() as tx:
            first.dialect.writer_turn(conn, "wa")
            taken = first.claim_in(conn, "wa", **limits(3, only="mock:a"))
            assert len(taken.requests) == 3
            side = second.claim("wb", **limits(3, only="mock:b"))  # in the same moment
            assert side.requests == [] and side.active_slots == 0  # it saw none running
            if not commit:
                tx.rollback()
        counts = first.status_counts()
        if commit:
            assert counts["running"] == 3
            assert second.claim("wb", **limits(3, only="mock:b")).requests == []
            first.record([Completed(r, r.attempt, "ok", 1) for r in taken.requests])
        else:
            assert counts.get("running", 0) == 0
            after = second.claim("wb", **limits(3, only="mock:b"))
            assert len(after.requests) == 3 and first.status_counts()["running"] == 3
            first.record([Completed(r, r.attempt, "ok", 1) for r in after.requests])
    for s in (first, second):
        s.close()


def test_every_way_a_running_request_ends_gives_its_slot_back(pg_url: str) -> None:
    """An outcome, a lease reclaimed, a worker released, a cancel waiting for the call: each
    transaction that ends `running` frees the slot, so the next claim has the whole limit."""
    store = Store(pg_url)
    add_requests(store, 12)
    one = store.claim("w", **limits(2)).requests
    store.record([Completed(one[0], one[0].attempt, "ok", 1)])  # an outcome
    store.release_worker("w", 3)  # a stopping daemon gives back what it held
    again = store.claim("w", **{**limits(2), "lease_seconds": -1}).requests  # leases already lapsed
    assert len(again) == 2
    reclaimed = store.claim("w2", **limits(2))  # reclaims both, and takes their slots
    assert len(reclaimed.reclaimed.requests) == 2 and len(reclaimed.requests) == 2
    store.cancel(ids=[r.id for r in reclaimed.requests])
    store.record([Completed(r, r.attempt, "ok", 1) for r in reclaimed.requests])  # end `canceled`
    _, held = _running(store)
    assert held == 0 and store.status_counts().get("running", 0) == 0
    assert len(store.claim("w3", **limits(2)).requests) == 2
    store.close()


def _ahead_counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per group commit's claim that had slots locked with its reads: whether it used
    them (True) or took the round trip that locks them itself (False)."""
    seen: list[bool] = []
    real = ClaimQueries._claim_ahead

    def counted(self: ClaimQueries, *args: Any) -> Any:
        found = real(self, *args)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(ClaimQueries, "_claim_ahead", counted)
    return seen


def _running(store: Store) -> tuple[dict[str, int], int]:
    """Running rows per pool, and slots held."""
    with store.engine.connect() as conn:
        running = dict(
            conn.execute(text("SELECT endpoint, count(*) FROM llm_requests WHERE status = 'running' GROUP BY 1")).all()
        )
        held = conn.execute(text("SELECT count(*) FROM llm_slots WHERE holder IS NOT NULL")).scalar_one()
    return running, held


def test_group_commits_side_by_side_claim_with_slots_locked_ahead_and_never_overshoot(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two daemons record their answers in the same moment, many times, each group commit claiming
    for the slots it freed with the slots locked in its first round trip (global limit 3, each of
    two pools 2): neither limit is ever passed, every running row holds its slots, and the slots
    locked ahead were what most claims used."""
    ahead = _ahead_counted(monkeypatch)
    stores = [Store(pg_url), Store(pg_url)]
    for s in stores:
        s.make_slots(3, {"mock:a": 2, "mock:b": 2})
    for i in range(150):  # the pools interleaved in claim order
        add_requests(stores[0], 1, model="ab"[i % 2], prefix=f"r{i}")
    args = {**limits(3), "pool_limit": lambda _: 2, "reclaim": False}
    held = [stores[0].claim("w0", **{**args, "max_claims": 2}).requests]
    held.append(stores[1].claim("w1", **{**args, "max_claims": 1}).requests)

    def step(i: int, mine: list[ClaimedRequest], barrier: threading.Barrier) -> list[ClaimedRequest]:
        barrier.wait()
        if not mine:
            return stores[i].claim(f"w{i}", **args).requests
        done = [Completed(r, r.attempt, "ok", 1) for r in mine]
        claim = stores[i].record(done, claim_for=f"w{i}", **args).claim
        assert claim is not None
        return claim.requests

    for _ in range(30):
        barrier = threading.Barrier(2)
        threads = [in_thread(functools.partial(step, i, held[i], barrier)) for i in range(2)]
        for thread, _ in threads:
            thread.join(timeout=30)
        held = [box[0] for _, box in threads]
        assert all(isinstance(h, list) for h in held), held
        running, slots_held = _running(stores[0])
        assert sum(running.values()) <= 3 and all(n <= 2 for n in running.values()), running
        assert slots_held == 2 * sum(running.values())  # a global slot and a pool's, each
    assert ahead.count(True) > ahead.count(False), ahead
    for s in stores:
        s.close()


def test_a_group_commit_claiming_ahead_keeps_to_a_pool_limit_learned_since_its_last_claim(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slots are locked ahead up to the limit the pool had (5); another daemon has since
    learned it serves 2. The claim keeps to what it reads in the same round trip: only slots
    numbered up to 2 are used, so 2 run, not 5."""
    ahead = _ahead_counted(monkeypatch)
    store = Store(pg_url)
    add_requests(store, 20)
    args = {**limits(5), "reclaim": False}
    taken = store.claim("w", **args).requests
    assert len(taken) == 5
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO llm_pools (endpoint, peak, learned_limit) VALUES ('mock:m', 5, 2)"))
    done = [Completed(r, r.attempt, "ok", 1) for r in taken[1:]]  # one call still out
    claim = store.record(done, claim_for="w", **args).claim
    assert claim is not None and len(claim.requests) == 1
    assert ahead == [True]
    assert _running(store) == ({"mock:m": 2}, 4)
    store.close()


def test_a_group_commit_that_freed_fewer_slots_than_are_free_locks_the_rest_itself(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots locked ahead are as many as the group frees; with more free (a call ended elsewhere),
    the claim locks them in a round trip of its own and fills them all."""
    ahead = _ahead_counted(monkeypatch)
    store = Store(pg_url)
    add_requests(store, 20)
    args = {**limits(5), "reclaim": False}
    taken = store.claim("w", **args).requests
    store.record([Completed(taken[0], taken[0].attempt, "ok", 1)])  # no claim: a slot left free
    claim = store.record([Completed(taken[1], taken[1].attempt, "ok", 1)], claim_for="w", **args).claim
    assert claim is not None and len(claim.requests) == 2
    assert ahead == [False]
    assert _running(store) == ({"mock:m": 5}, 10)
    store.close()
