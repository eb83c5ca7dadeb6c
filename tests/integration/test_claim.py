"""Claim = slot: limits, pools, fairness, fencing and leases, on both databases."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from ledger.enqueue import build_spec, to_row
from ledger.store import Store, driver_runs
from ledger.store import claim as claim_sql
from ledger.store import outcome_writes as queue
from ledger.store.commit import transaction
from ledger.store.dialect import is_transient
from ledger.store.queue import CancelResult
from ledger.store.rows import AttemptFailure, Claim, ClaimedRequest, Completed, PoolWindow, RetryLater, Written
from tests.integration.store_helpers import add_requests


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()


def complete(store: Store, claimed: Claim) -> None:
    """The calls of `claimed` return: their slots are free."""
    if claimed.requests:
        store.record([Completed(r, r.attempt, "ok", 1) for r in claimed.requests])


def claim(
    store: Store,
    worker: str = "w1",
    *,
    limit: int = 5,
    pool: Callable[[str], int] | None = None,
    lease: float = 30.0,
    max_claims: int = 50,
) -> list[int]:
    result = store.claim(
        worker,
        lease_seconds=lease,
        global_limit=limit,
        pool_limit=pool or (lambda _: limit),
        max_attempts=3,
        max_claims=max_claims,
    )
    return [r.id for r in result.requests]


def test_global_limit_counts_every_worker(store: Store) -> None:
    add_requests(store, 12)
    assert len(claim(store, "w1")) == 5
    assert claim(store, "w2") == []
    assert store.status_counts()["running"] == 5


def test_a_saturated_pool_never_blocks_another(store: Store) -> None:
    add_requests(store, 10, model="slow", prefix="s")
    add_requests(store, 3, model="fast", prefix="f")
    limits = {"mock:slow": 2, "mock:fast": 5}
    ids = claim(store, pool=lambda ep: limits[ep], limit=10)
    usage = store.pool_usage()
    assert usage["mock:slow"]["running"] == 2
    assert usage["mock:fast"]["running"] == 3
    assert len(ids) == 5


LIMITS = {"lease_seconds": 30.0, "max_attempts": 3}


@pytest.mark.parametrize("sweep", [False, True], ids=["reads sent with the group", "after a lease sweep"])
def test_a_group_commit_refills_past_a_full_pool_whose_rows_come_first(store: Store, sweep: bool) -> None:
    """The slot a group frees goes to the first due row that fits, even when the rows ahead of
    it all belong to a pool that is full: the claim reads past them (more of them than a
    group commit reads ahead: its claim must read again)."""
    add_requests(store, 14, model="slow", prefix="s")
    add_requests(store, 4, model="fast", prefix="f")
    pools = {"mock:slow": 2, "mock:fast": 5}
    limits = {**LIMITS, "global_limit": 4, "pool_limit": lambda ep: pools[ep], "max_claims": 4}
    first = store.claim("w", **limits)
    assert [r.endpoint for r in first.requests] == ["mock:slow"] * 2 + ["mock:fast"] * 2
    fast = first.requests[2]
    recorded = store.record([Completed(fast, fast.attempt, "ok", 1)], claim_for="w", reclaim=sweep, **limits)
    assert recorded.claim is not None
    assert [(r.endpoint, r.idempotency_key) for r in recorded.claim.requests] == [("mock:fast", "f-2")]


@pytest.mark.parametrize("sweep", [False, True], ids=["reads sent with the group", "after a lease sweep"])
def test_a_group_commit_opens_nothing_in_a_pool_cooling_down_or_held(store: Store, sweep: bool) -> None:
    """A pool serving a retry-after, or whose refusal is on its way to the ledger, gets no new
    call from a group commit's refill, though its rows are first in the queue."""
    add_requests(store, 6, model="a")
    add_requests(store, 2, model="b")
    limits = {**LIMITS, "global_limit": 4, "pool_limit": lambda _: 4, "max_claims": 4}
    (first,) = store.claim("w", **{**limits, "max_claims": 1}).requests
    store.record([RetryLater(first, 1, AttemptFailure(429, "rate_limited", "slow down", 1), 0.0, False, 30.0)])
    (second,) = store.claim("w", **{**limits, "max_claims": 1}).requests
    assert second.endpoint == "mock:b"  # a cools down for 30 s
    recorded = store.record(
        [Completed(second, second.attempt, "ok", 1)], claim_for="w", reclaim=sweep, hold=["mock:b"], **limits
    )
    assert recorded.claim is not None and recorded.claim.requests == []


@pytest.mark.parametrize("sweep", [False, True], ids=["reads sent with the group", "after a lease sweep"])
def test_a_group_commit_fills_every_free_slot_not_only_those_it_freed(store: Store, sweep: bool) -> None:
    """Slots free before the group (more than a group commit reads ahead for the one it frees)
    are filled by its claim too."""
    add_requests(store, 40)
    limits = {**LIMITS, "global_limit": 20, "pool_limit": lambda _: 20, "max_claims": 20}
    (only,) = store.claim("w", **{**limits, "max_claims": 1}).requests
    recorded = store.record([Completed(only, only.attempt, "ok", 1)], claim_for="w", reclaim=sweep, **limits)
    assert recorded.claim is not None and len(recorded.claim.requests) == 20
    counts = store.status_counts()
    assert (counts["completed"], counts["running"], counts["queued"]) == (1, 20, 19)


def test_a_small_job_is_not_starved_by_a_huge_one(store: Store) -> None:
    add_requests(store, 200, job="huge", prefix="h")
    first = store.claim("w1", lease_seconds=30, global_limit=4, pool_limit=lambda _: 4, max_attempts=3, max_claims=4)
    assert len(first.requests) == 4  # the huge job starts first
    add_requests(store, 3, job="small", prefix="s")
    # Free the slots: the next claims interleave the small job instead of queueing it last.
    complete(store, first)
    next_ids = claim(store, limit=4)
    jobs = [store.get_request(i)["job_id"] for i in next_ids]  # type: ignore[index]
    assert jobs.count("small") >= 2, jobs


def test_priority_runs_first(store: Store) -> None:
    add_requests(store, 5, prefix="low")
    store.enqueue(
        [
            to_row(
                build_spec(
                    model="m",
                    provider="mock",
                    priority=10,
                    idempotency_key="urgent",
                    messages=[{"role": "user", "content": "now"}],
                )
            )
        ]
    )
    (first,) = claim(store, max_claims=1)
    assert store.get_request(first)["idempotency_key"] == "urgent"  # type: ignore[index]


def test_cancel_wins_over_a_late_completion(store: Store) -> None:
    add_requests(store, 1)
    result = store.claim("w1", lease_seconds=30, global_limit=5, pool_limit=lambda _: 5, max_attempts=3, max_claims=5)
    (request,) = result.requests
    assert store.cancel(ids=[request.id]) == CancelResult(canceled=0, in_flight=1)
    recorded = store.record([Completed(request, 1, "late answer", 10)])
    assert recorded.written == [Written.CANCELED]
    row = store.get_request(request.id)
    assert row is not None and row["status"] == "canceled" and row["error_code"] == "canceled"
    # The paid call is on record, beside the cancel: its output kept, never shown as completed.
    assert row["raw_output"] == "late answer" and row["attempt_rows"][0]["outcome"] == "succeeded"


def test_expired_lease_is_reclaimed_and_the_stale_worker_is_fenced_out(store: Store) -> None:
    add_requests(store, 1)
    old = store.claim(
        "dead", lease_seconds=0.05, global_limit=5, pool_limit=lambda _: 5, max_attempts=3, max_claims=5
    ).requests[0]
    time.sleep(0.1)  # let the database clock pass the lease (the thing under test is expiry)
    new = store.claim("alive", lease_seconds=30, global_limit=5, pool_limit=lambda _: 5, max_attempts=3, max_claims=5)
    assert [r.id for r in new.reclaimed.requests] == [old.id] and [r.id for r in new.requests] == [old.id]
    assert new.requests[0].attempt == 2 and new.requests[0].token > old.token
    assert store.record([Completed(old, 1, "from the dead", 5)]).written == [Written.REFUSED]
    assert store.record([Completed(new.requests[0], 2, "fresh", 5)]).written == [Written.APPLIED]
    row = store.get_request(old.id)
    assert row is not None and row["raw_output"] == "fresh"
    assert [a["outcome"] for a in row["attempt_rows"]] == ["succeeded", "succeeded"] or row["attempt_rows"][1][
        "outcome"
    ] == "succeeded"


def test_retry_that_releases_the_slot_waits_for_its_deadline(store: Store) -> None:
    add_requests(store, 1)
    (request,) = store.claim(
        "w", lease_seconds=30, global_limit=5, pool_limit=lambda _: 5, max_attempts=3, max_claims=5
    ).requests
    failure = AttemptFailure(None, "timeout", "no answer", 100)
    assert store.record([RetryLater(request, 1, failure, delay_s=30, hold_slot=False)]).written == [Written.APPLIED]
    assert store.status_counts()["queued"] == 1
    assert claim(store) == []  # not due for 30 s
    row = store.get_request(request.id)
    assert row is not None and row["attempts"] == 1 and row["attempt_rows"][0]["outcome"] == "timeout"


def test_429_cooldown_stops_every_worker_claiming_from_the_pool(store: Store) -> None:
    add_requests(store, 3, model="limited", prefix="l")
    add_requests(store, 1, model="other", prefix="o")
    (first,) = store.claim(
        "w", lease_seconds=30, global_limit=5, pool_limit=lambda _: 5, max_attempts=3, max_claims=1
    ).requests
    failure = AttemptFailure(429, "rate_limit", "slow down", 5)
    store.record([RetryLater(first, 1, failure, delay_s=30, hold_slot=True, pool_cooldown_s=30)])
    ids = claim(store, "w2")
    assert [store.get_request(i)["model"] for i in ids] == ["other"]  # type: ignore[index]
    assert store.pool_usage()["mock:limited"]["cooldown_until"] is not None


def test_a_shorter_retry_after_never_cuts_a_longer_cooldown_short(store: Store) -> None:
    add_requests(store, 2, model="limited", prefix="l")
    calls = store.claim("w", lease_seconds=30, global_limit=5, pool_limit=lambda _: 5, max_attempts=3, max_claims=2)
    failure = AttemptFailure(429, "rate_limit", "slow down", 5)
    long, short = (  # 429s whose headers say the window is spent: the whole pool waits
        RetryLater(r, 1, failure, delay_s=s, hold_slot=True, pool_cooldown_s=s, window=PoolWindow(0, s))
        for r, s in zip(calls.requests, (30, 0.01), strict=True)
    )
    store.record([long])
    until = store.pool_usage()["mock:limited"]["cooldown_until"]
    store.record([short])  # e.g. another daemon's 429 with a retry-after of 10 ms
    assert store.pool_usage()["mock:limited"]["cooldown_until"] == until


@pytest.mark.parametrize("limit", [3])
def test_two_claimers_in_the_same_moment_never_overshoot(pg_url: str, limit: int) -> None:
    """Force two claim transactions to start together, many times; the limit must hold."""
    stores = [Store(pg_url), Store(pg_url)]
    add_requests(stores[0], 400)
    overshoot: list[int] = []
    for _ in range(30):
        barrier = threading.Barrier(2)

        claims: list[Claim] = []

        def go(i: int, barrier: threading.Barrier = barrier, claims: list[Claim] = claims) -> None:
            barrier.wait()
            result = stores[i].claim(
                f"w{i}",
                lease_seconds=30,
                global_limit=limit,
                pool_limit=lambda _: limit,
                max_attempts=3,
                max_claims=limit,
            )
            claims.append(result)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        running = stores[0].status_counts()["running"]
        if running > limit:
            overshoot.append(running)
        assert running == limit
        for claimed in claims:
            complete(stores[0], claimed)
    assert overshoot == []
    for s in stores:
        s.close()


def test_an_answer_with_a_nul_or_a_lone_surrogate_is_kept_whole_and_readable(store: Store) -> None:
    """A JSON body can carry `\\u0000` and unpaired surrogates: PostgreSQL refuses them and SQLite
    cut the text at a NUL. Each becomes U+FFFD; the rest of the paid answer is kept."""
    add_requests(store, 1)
    limits = {"lease_seconds": 30, "global_limit": 5, "pool_limit": lambda _: 5, "max_attempts": 3, "max_claims": 5}
    (request,) = store.claim("w1", **limits).requests
    text = "before\x00after \ud800 end"
    assert store.record([Completed(request, 1, text, 10)]).written == [Written.APPLIED]
    row = store.get_request(request.id)
    assert row is not None and row["status"] == "completed"
    raw = row["raw_output"]
    assert raw.startswith("before\ufffdafter \ufffd") and raw.endswith(" end") and "\x00" not in raw


def test_postgresql_reaches_a_group_and_a_claim_by_key_not_by_scanning_the_ledger(pg_url: str) -> None:
    """PostgreSQL takes a JSON chunk of rows for a hundred whatever it holds, and would rather
    scan a ledger of some thousands of requests than look up a hundred keys: every group commit
    of a young ledger read every request it ever had. The statements say their keys as an
    array too (`bound_rows.match`), which it looks up by index."""
    store = Store(pg_url)
    try:
        add_requests(store, 3000)
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE llm_requests")
            conn.exec_driver_sql("ANALYZE llm_attempts")
        taken = store.claim("w", global_limit=5, pool_limit=lambda _: 5, max_claims=5, **LIMITS).requests
        picked = [{"id": i} for i in range(10, 15)]
        statements = [
            _completing(taken),
            (claim_sql._TAKE_AND_START, {**claim_sql._PICKED.bind(picked), "b_worker": "w"}),
        ]
        with store.engine.connect() as conn:
            for stmt, params in statements:
                sql, args = store.dialect._driver_args(conn, stmt, {**params, "b_lease": 30.0})
                plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + sql, args))
                assert "Seq Scan on llm_requests" not in plan, plan
    finally:
        store.close()


def _completing(taken: list[ClaimedRequest]) -> tuple[Any, dict[str, Any]]:
    """The group commit's statement that records `taken` as answered, with its parameters."""
    group = [{"id": r.id, "token": r.token, "attempt": r.attempt, "outcome": "succeeded", "raw": "ok"} for r in taken]
    return queue._WITH_ATTEMPTS["completed"], {**queue._V.bind(group), **queue._VA.bind(group)}


def _complete_without_vacuum(store: Store, n: int) -> None:
    """`n` requests claimed and completed 50 at a time, autovacuum off: every dead index entry
    a run leaves stays where the next statement finds it, and neither table is analysed."""
    with store.engine.begin() as conn:
        for table in ("llm_requests", "llm_attempts"):
            conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    add_requests(store, n)
    limits = {"global_limit": 50, "pool_limit": lambda _: 50, "max_claims": 50, **LIMITS}
    while taken := store.claim("w", **limits).requests:
        store.record([Completed(r, r.attempt, "ok", 1) for r in taken])


def test_postgresql_closes_a_group_s_attempts_by_key_on_a_young_ledger(pg_url: str) -> None:
    """A group commit closes its attempts by (request id, attempt). On a ledger some thousands of
    attempts long and not analysed yet (autovacuum's first ANALYZE comes a minute or more into a
    run), the planner takes each key for 1/200 of the table, and fifty of them for about a fifth:
    every group commit read the whole table instead (1.9 ms of its 7 at 10,000 attempts, issue
    9). The hot statements never scan a table where an index reaches their rows (`PLANS_BY_KEY`)."""
    store = Store(pg_url)
    try:
        _complete_without_vacuum(store, 3000)
        add_requests(store, 50, prefix="group")
        taken = store.claim("w", global_limit=50, pool_limit=lambda _: 50, max_claims=50, **LIMITS).requests
        assert len(taken) == 50
        with transaction(store.engine, store.dialect) as conn:
            sql, args = store.dialect._driver_args(conn, *_completing(taken))
            (ran,) = driver_runs.in_one_query(conn, [(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", args)])
            scans = _scans(ran.rows[0][0][0]["Plan"])
        assert ("llm_attempts", "Index Scan") in scans and ("llm_attempts", "Seq Scan") not in scans, scans
        with store.engine.connect() as conn:  # EXPLAIN ANALYZE ran it: the group's attempts are closed
            closed = "SELECT count(*) FROM llm_attempts WHERE request_id >= :first AND outcome = 'succeeded'"
            assert conn.execute(text(closed), {"first": min(r.id for r in taken)}).scalar_one() == 50
    finally:
        store.close()


def _scans(plan: dict[str, Any]) -> set[tuple[str, str]]:
    """(table, kind of scan) of every scan in an EXPLAIN's JSON plan."""
    scans = "Scan" in plan["Node Type"] and "Relation Name" in plan
    found = {(plan["Relation Name"], plan["Node Type"])} if scans else set()
    for child in plan.get("Plans", []):
        found |= _scans(child)
    return found


def test_postgresql_counts_running_requests_without_revisiting_those_finished_since_the_last_vacuum(
    pg_url: str,
) -> None:
    """Every claim counts the running requests per pool through the in-flight index. A request
    that ran leaves a dead entry there until a vacuum; a bitmap scan visits its heap page at every
    count, so with autovacuum a minute away the claims of a busy ledger slowed down as it went
    (2.5 ms a group commit after 20,000 requests). The hot statements get plain index scans,
    which mark such entries dead once: a later count reads a few pages, not every finished row's."""
    store = Store(pg_url)
    try:
        _complete_without_vacuum(store, 3000)
        with store.engine.connect() as conn:
            pages = conn.exec_driver_sql("SELECT pg_relation_size('llm_requests') / 8192").scalar_one()
        assert store.status_counts()["completed"] == 3000 and pages > 100
        (count_running, params), *_ = store.claim_reads("w", 30.0, 1).statements
        with transaction(store.engine, store.dialect) as conn:
            sql, args = store.dialect._driver_args(conn, count_running, params)
            explain = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"
            for _ in range(2):  # the first count marks the dead entries; the second is what every claim pays
                (ran,) = driver_runs.in_one_query(conn, [(explain, args)])
            plan = ran.rows[0][0][0]["Plan"]
        # Before: every page holding a finished request (444 of them here); now the index's own.
        assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] < pages / 4, plan
    finally:
        store.close()


def test_postgresql_online_requests_write_no_entries_to_the_batch_index_which_lookups_still_use(pg_url: str) -> None:
    """Every UPDATE that changes an indexed column (a claim, an outcome) gives the row a new entry
    in every index that covers it: online requests have no batch id, so a batch index over every
    row grew by three entries a request for nothing (decision 75). Indexed only where set, it
    stays empty through a run, and a lookup by batch id (or by completion time, the budget's)
    still goes through its index, in the generic plan a prepared statement ends up with too."""
    store = Store(pg_url)
    try:
        _complete_without_vacuum(store, 2000)
        assert store.status_counts()["completed"] == 2000
        with store.engine.connect() as conn:
            size = "SELECT pg_relation_size('{}') / 8192"
            assert conn.exec_driver_sql(size.format("ix_llm_requests_batch")).scalar_one() == 1  # its metapage
            assert conn.exec_driver_sql(size.format("ix_llm_requests_completed")).scalar_one() > 2
            # Whether the index is the cheapest way is the planner's estimate; whether it can be used
            # at all (its predicate implied by the lookup's) is what this asks.
            conn.exec_driver_sql("SET enable_seqscan = off")
            conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            conn.exec_driver_sql("PREPARE by_batch(bigint) AS SELECT id FROM llm_requests WHERE batch_id = $1")
            conn.exec_driver_sql(
                "PREPARE since(timestamptz) AS SELECT count(*) FROM llm_requests WHERE completed_at >= $1"
            )
            lookups = [("by_batch(1)", "ix_llm_requests_batch"), ("since(now())", "ix_llm_requests_completed")]
            for query, index in lookups:
                plan = "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN EXECUTE {query}"))
                assert index in plan, plan
    finally:
        store.close()


def test_postgresql_plans_by_key_the_hot_statements_and_not_the_rest_of_their_transaction(pg_url: str) -> None:
    """The planner settings of the hot statements (`run_all`) hold for them alone, sent as one
    query or, with long outputs, one by one: a budget's OR of two indexes later in the same
    transaction still gets its bitmap scans. JIT is off with them: with scans off, the few-row
    scans left (the pools, the live daemons) are costed past its threshold, and it compiled
    them for 24-370 ms a group commit."""
    store = Store(pg_url)
    names = ("enable_nestloop", "enable_bitmapscan", "enable_seqscan", "jit")
    settings = "SELECT " + ", ".join(f"current_setting('{name}') AS s{i}" for i, name in enumerate(names))
    probe = text(settings + ", :p AS p")
    try:
        with transaction(store.engine, store.dialect) as conn:
            usual = tuple(conn.exec_driver_sql(settings).one())
            assert usual[:3] == ("on", "on", "on")
            for value in ("short", "x" * (driver_runs.INLINE_AT_MOST + 1)):
                (inside,) = store.dialect.run_all(conn, [(probe, {"p": value})])
                assert tuple(inside.rows[0])[:4] == ("off", "off", "off", "off")
                assert tuple(conn.exec_driver_sql(settings).one()) == usual
    finally:
        store.close()


def test_a_hot_statement_that_fails_raises_the_error_sqlalchemy_would_and_is_not_retried(store: Store) -> None:
    """The claim's and the group commit's statements bypass SQLAlchemy's execute (one query on
    PostgreSQL, the driver's cursor on SQLite): their errors must still reach the lane's retry
    rules and the callers' `except` clauses as SQLAlchemy's."""
    add_requests(store, 1)
    started = claim(store)
    again = text("INSERT INTO llm_attempts (request_id, attempt, outcome) VALUES (:id, :attempt, 'running')")
    with pytest.raises(IntegrityError) as caught, transaction(store.engine, store.dialect) as conn:
        store.dialect.run_all(conn, [(again, {"id": started[0], "attempt": 1})])  # the attempt row exists
    assert not is_transient(caught.value)
    with store.engine.connect() as conn:  # the failed transaction wrote nothing
        assert conn.execute(text("SELECT COUNT(*) FROM llm_attempts")).scalar_one() == 1
