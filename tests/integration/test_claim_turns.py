"""Claims without a ledger-wide lock (PostgreSQL): a claim waits only for claims of its own pools,
and the global limit holds across pools claimed side by side (the slots)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from ledger.store import Store
from ledger.store.rows import Claim, Completed
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
    with store.engine.connect() as conn:
        held = conn.execute(text("SELECT count(*) FROM llm_slots WHERE holder IS NOT NULL")).scalar_one()
    assert held == 0 and store.status_counts().get("running", 0) == 0
    assert len(store.claim("w3", **limits(2)).requests) == 2
    store.close()
