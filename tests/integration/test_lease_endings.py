"""How a held slot ends when the call has no ordinary outcome: cancel, dead worker, stop, restart.

The rule under test everywhere: a slot is freed exactly once, by whoever ends the
lease, and never while the provider may still be working on the call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ledger.record import RecorderStopped
from ledger.store import Store
from ledger.store.dialect import CLAIM_LOCK
from ledger.store.queue import CancelResult
from ledger.store.rows import AttemptFailure, Claim, ClaimedRequest, Completed, RetryLater, Written
from tests.integration.store_helpers import add_requests, kept_records

LIMITS: dict[str, Any] = {"global_limit": 5, "pool_limit": lambda _: 5, "max_attempts": 3, "max_claims": 5}


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()


def claim(store: Store, worker: str, *, lease: float = 30.0, **limits: Any) -> Claim:
    """`lease` < 0 claims with a lease that has already run out (a worker that died at once)."""
    return store.claim(worker, lease_seconds=lease, **{**LIMITS, **limits})


def test_a_canceled_call_in_flight_keeps_its_slot_until_it_returns(store: Store) -> None:
    add_requests(store, 2)
    (call,) = claim(store, "w1", global_limit=1).requests
    assert store.cancel(ids=[call.id]) == CancelResult(canceled=0, in_flight=1)
    assert store.status_counts()["running"] == 1  # the provider is still working on it
    assert claim(store, "w2", global_limit=1).requests == []  # so its slot is not handed out
    assert store.record([Completed(call, 1, "paid for", 7)]).written == [Written.CANCELED]
    row = store.get_request(call.id)
    assert row is not None and (row["status"], row["raw_output"]) == ("canceled", "paid for")
    assert [r.id for r in claim(store, "w2", global_limit=1).requests] == [call.id + 1]


def test_canceling_a_waiting_request_ends_it_at_once_and_a_final_one_not_at_all(store: Store) -> None:
    add_requests(store, 3)
    (done,) = claim(store, "w", max_claims=1).requests
    store.record([Completed(done, 1, "ok", 1)])
    result = store.cancel(ids=[done.id, done.id + 1])
    assert result == CancelResult(canceled=1, in_flight=0)
    assert store.get_request(done.id)["status"] == "completed"  # type: ignore[index]
    assert store.get_request(done.id + 1)["status"] == "canceled"  # type: ignore[index]


def test_a_cancel_during_a_held_back_off_ends_the_request_before_another_call(store: Store) -> None:
    add_requests(store, 1)
    (call,) = claim(store, "w").requests
    busy = AttemptFailure(503, "server_error", "busy", 3)
    assert store.record([RetryLater(call, 1, busy, delay_s=5, hold_slot=True)]).written == [Written.APPLIED]
    store.cancel(ids=[call.id])
    next_attempt = store.begin_attempt(call)
    assert next_attempt.number is None and next_attempt.canceled and next_attempt.freed_slot
    row = store.get_request(call.id)
    assert row is not None and row["status"] == "canceled" and row["attempts"] == 1
    assert [a["outcome"] for a in row["attempt_rows"]] == ["failed"]  # no second call was started
    assert (row["last_status_code"], row["error_message"]) == (503, "canceled during a back-off between attempts")


def test_a_retry_that_would_release_its_slot_ends_canceled_instead(store: Store) -> None:
    add_requests(store, 1)
    (call,) = claim(store, "w").requests
    store.cancel(ids=[call.id])
    timed_out = AttemptFailure(None, "timeout", "no answer", 100)
    assert store.record([RetryLater(call, 1, timed_out, 0, hold_slot=False)]).written == [Written.CANCELED]
    assert store.status_counts()["canceled"] == 1 and claim(store, "w").requests == []


def test_a_dead_workers_canceled_request_ends_canceled_when_its_lease_runs_out(store: Store) -> None:
    add_requests(store, 2)
    dead = claim(store, "dead", lease=-1).requests
    store.cancel(ids=[dead[0].id])
    alive = claim(store, "alive")
    assert sorted(r.id for r in alive.reclaimed.requests) == [dead[0].id, dead[1].id]
    assert alive.reclaimed.active_slots == 0  # both dead slots freed, before the new claim
    assert [r.id for r in alive.requests] == [dead[1].id]  # the canceled one is not called again
    canceled = store.get_request(dead[0].id)
    assert canceled is not None and canceled["status"] == "canceled"
    assert canceled["attempt_rows"][0]["outcome"] == "lost"


@pytest.mark.parametrize(("max_attempts", "ends"), [(1, "error"), (2, "queued")])
def test_a_call_cut_off_by_a_stop_counts_against_the_attempt_budget(store: Store, max_attempts: int, ends: str) -> None:
    add_requests(store, 1)
    (call,) = claim(store, "w").requests
    released = store.release_worker("w", max_attempts)
    assert [r.id for r in released.requests] == [call.id] and released.active_slots == 0
    row = store.get_request(call.id)
    assert row is not None and row["status"] == ends and row["attempts"] == 1
    assert row["attempt_rows"][0]["outcome"] == "lost"
    if ends == "error":
        assert row["error_code"] == "worker_stopped" and "last of 1 attempts" in row["error_message"]


@pytest.mark.parametrize(("max_attempts", "ends"), [(1, "error"), (3, "queued")])
def test_a_dead_worker_during_the_last_attempt_ends_the_request_in_error(
    store: Store, max_attempts: int, ends: str
) -> None:
    add_requests(store, 1)
    (call,) = claim(store, "dead", lease=-1).requests
    alive = claim(store, "alive", max_attempts=max_attempts)
    assert [r.id for r in alive.reclaimed.requests] == [call.id]
    row = store.get_request(call.id)
    assert row is not None
    if ends == "error":
        assert (row["status"], row["error_code"]) == ("error", "lease_expired") and alive.requests == []
    else:
        assert row["status"] == "running" and row["attempts"] == 2  # reclaimed and claimed again at once


def test_only_the_leases_a_worker_is_working_on_are_renewed(store: Store) -> None:
    add_requests(store, 2)
    working, forgotten = claim(store, "w", lease=-1).requests
    assert store.renew_leases("w", 30, [(working.id, working.token)]) == [(working.id, working.token)]
    other = claim(store, "other")
    assert [r.id for r in other.reclaimed.requests] == [forgotten.id]
    row = store.get_request(working.id)
    assert row is not None and row["status"] == "running" and row["lease_owner"] == "w"


def test_a_lease_claimed_again_is_not_renewed_for_the_earlier_claim(store: Store) -> None:
    add_requests(store, 1)
    (first,) = claim(store, "w", lease=-1).requests  # its lease ran out; it is reclaimed and claimed again
    (again,) = claim(store, "w", lease=-1).requests
    assert again.id == first.id and again.token != first.token
    assert store.renew_leases("w", 30, [(first.id, first.token)]) == []  # the stale executor's renewal
    assert store.renew_leases("w", 30, [(again.id, again.token)]) == [(again.id, again.token)]


def test_a_late_claimer_keeps_what_it_is_working_on_instead_of_reclaiming_it(store: Store) -> None:
    """A daemon that could not renew in time (a database outage) and claims again: its own
    calls in flight are renewed, not reclaimed and called a second time beside themselves."""
    add_requests(store, 3)
    working, forgotten = claim(store, "w", lease=-1, max_claims=2).requests
    late = claim(store, "w", held=[(working.id, working.token)])
    assert [r.id for r in late.reclaimed.requests] == [forgotten.id]
    row = store.get_request(working.id)
    assert row is not None and row["status"] == "running" and row["lease_token"] == working.token


# -- PostgreSQL: concurrent transactions, forced into the order that used to go wrong ----------


def wait_until_blocked_by(store: Store, pid: int, timeout: float = 10.0) -> None:
    """Poll until some other session waits for a lock that session `pid` holds."""
    deadline = time.monotonic() + timeout
    query = text("SELECT COUNT(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    while time.monotonic() < deadline:
        with store.engine.connect() as conn:
            if conn.execute(query, {"pid": pid}).scalar_one():
                return
        time.sleep(0.01)
    raise AssertionError(f"no session became blocked by {pid} within {timeout}s")


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except Exception as exc:
            box.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def test_recording_while_a_claimer_reclaims_the_same_row_does_not_deadlock(pg_url: str) -> None:
    """A recorder that claims in its own transaction vs a claimer reclaiming that row's lease.

    The recorder used to lock the row first and wait for the claim lock, while the
    claimer held the claim lock and waited for the row: PostgreSQL killed one of them,
    and with it a paid result.
    """
    store, claimer = Store(pg_url), Store(pg_url)
    add_requests(store, 1)
    (call,) = claim(store, "slow", lease=-1).requests  # its lease ran out while the call was made
    with claimer.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.execute(text(f"SELECT pg_advisory_xact_lock({CLAIM_LOCK})"))  # a claim in progress
        thread, box = in_thread(
            lambda: store.record([Completed(call, 1, "paid", 3)], claim_for="slow", lease_seconds=30, **LIMITS)
        )
        wait_until_blocked_by(store, pid)
        conn.execute(text("SET LOCAL lock_timeout = '5s'"))
        # The claimer reclaims the expired lease: it must get the row, not wait on the recorder.
        conn.execute(
            text("UPDATE llm_requests SET status = 'queued', lease_owner = NULL WHERE id = :id"), {"id": call.id}
        )
        conn.commit()
    thread.join(timeout=30)
    assert len(box) == 1 and not isinstance(box[0], Exception), box
    assert box[0].written == [Written.REFUSED]  # the lease was taken over: the fence keeps it out
    store.close()
    claimer.close()


def test_two_daemons_learning_a_limit_at_once_keep_the_lower_lesson(pg_url: str) -> None:
    """Our 429 says "at most 3" (3 other calls in flight) while another daemon, not committed yet,
    learned 2: the lower lesson stands, whichever commits last (never overwritten by ours)."""
    store, other = Store(pg_url), Store(pg_url)
    add_requests(store, 4)
    calls = claim(store, "w", max_claims=4).requests
    assert len(calls) == 4
    with other.engine.begin() as conn:
        conn.execute(text("INSERT INTO llm_pools (endpoint, learned_limit, successes) VALUES ('mock:m', 5, 0)"))
    with other.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        # Another daemon's lesson, noted but not yet committed.
        conn.execute(text("UPDATE llm_pools SET learned_limit = 2 WHERE endpoint = 'mock:m'"))
        limited = AttemptFailure(429, "rate_limit", "slow down", 2)
        thread, box = in_thread(lambda: store.record([RetryLater(calls[0], 1, limited, delay_s=1)]))
        wait_until_blocked_by(store, pid)
        conn.commit()
    thread.join(timeout=30)
    assert box and not isinstance(box[0], Exception), box
    assert store.pool_usage()["mock:m"]["learned_limit"] == 2
    store.close()
    other.close()


def test_cancel_catches_a_request_going_back_to_the_queue_at_that_moment(pg_url: str) -> None:
    """A running request requeued (a timeout's retry) while the cancel runs: the cancel still gets it.

    Cancel used to be two statements (waiting rows, then running rows); a row that
    moved from running to queued between them matched neither and was called again.
    """
    store, recorder = Store(pg_url), Store(pg_url)
    add_requests(store, 1)
    (call,) = claim(store, "w").requests
    with recorder.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        # The recorder writes the timeout's retry: back to the queue, not yet committed.
        conn.execute(
            text("UPDATE llm_requests SET status = 'queued', lease_owner = NULL WHERE id = :id"), {"id": call.id}
        )
        thread, box = in_thread(lambda: store.cancel(ids=[call.id]))
        wait_until_blocked_by(store, pid)
        conn.commit()
    thread.join(timeout=30)
    assert box == [CancelResult(canceled=1, in_flight=0)], box
    row = store.get_request(call.id)
    assert row is not None and row["status"] == "canceled"
    assert claim(store, "w").requests == []  # it is not called again
    store.close()
    recorder.close()


def test_a_renewal_given_up_on_never_lands_later(pg_url: str) -> None:
    """The daemon gives up a renewal stuck behind a lock when its leases are about to lapse; the
    database must give it up too, or it would land later and revive leases already let go."""
    store, blocker = Store(pg_url), Store(pg_url)
    add_requests(store, 1)
    (call,) = claim(store, "w").requests
    key = (call.id, call.token)
    before = store.get_request(call.id)["lease_expires_at"]  # type: ignore[index]
    with blocker.engine.connect() as conn:
        conn.execute(text(f"SELECT pg_advisory_xact_lock({CLAIM_LOCK})"))
        thread, box = in_thread(lambda: store.renew_leases("w", 600, [key], wait_at_most=0.2))
        thread.join(timeout=10)  # without its own deadline it would wait here for the blocker
        conn.commit()
    thread.join(timeout=10)
    assert len(box) == 1 and isinstance(box[0], DBAPIError) and "timeout" in str(box[0]), box
    assert store.get_request(call.id)["lease_expires_at"] == before  # type: ignore[index]
    assert store.renew_leases("w", 600, [key], wait_at_most=5) == [key]
    store.close()
    blocker.close()


def test_a_late_outcome_does_not_rewrite_the_attempt_a_takeover_marked_lost(store: Store) -> None:
    """The attempt row is fenced like the request row. A worker frozen past its lease
    comes back with an answer: the takeover's `lost` attempt stays lost, the new owner's stays its own."""
    add_requests(store, 1)
    (stale,) = claim(store, "frozen", lease=-1).requests  # its lease has already run out
    (fresh,) = claim(store, "taker").requests  # reclaims it (attempt 1 lost) and claims attempt 2
    assert fresh.id == stale.id and fresh.attempt == 2
    assert store.record([Completed(stale, stale.attempt, "late answer", 5)]).written == [Written.REFUSED]
    store.record([Completed(fresh, fresh.attempt, "answer", 5)])
    row = store.get_request(stale.id)
    assert row is not None and row["raw_output"] == "answer"
    outcomes = [(a["attempt"], a["outcome"], a["worker"]) for a in row["attempt_rows"]]
    assert outcomes == [(1, "lost", "frozen"), (2, "succeeded", "taker")]


def test_a_claim_after_an_outage_does_not_reclaim_rows_whose_answers_wait_to_be_written(
    db_url: str, store: Store
) -> None:
    """After an outage longer than a lease, the daemon's first claim must not put back
    in the queue (to be called again) the requests whose answers it holds but has not written."""
    from ledger.executor import CallContext
    from ledger.record import DbLane, Recorder
    from ledger.retry import RetryPolicy
    from ledger.scheduler import Scheduler
    from ledger.settings import load_settings

    add_requests(store, 1)
    (answered,) = claim(store, "daemon", lease=-1).requests  # its lease ran out during the outage
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=db_url)
    lane = DbLane(1.0)
    recorder = Recorder(store, lane, lambda _claim: None)
    context = CallContext(store, lane, recorder, RetryPolicy(0, 0, 3), 5.0, settings.prices)
    scheduler = Scheduler(context, settings, "daemon")

    async def outcome_waiting_then_claim() -> Claim:
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.submit, Completed(answered, answered.attempt, "the answer", 5))
            await anyio.sleep(0)  # the answer is in hand, not written yet (the recorder waits on the database)
            claimed = await lane.run(lambda: store.claim("daemon", **scheduler.limits_now()))
            await recorder.flush()  # the database is back: the answer is written
        return claimed

    claimed = anyio.run(outcome_waiting_then_claim)
    assert claimed.reclaimed.requests == [] and claimed.requests == []
    row = store.get_request(answered.id)
    assert row is not None and (row["status"], row["raw_output"]) == ("completed", "the answer")
    assert [a["outcome"] for a in row["attempt_rows"]] == ["succeeded"]


def test_a_daemon_woken_after_a_freeze_does_not_call_for_a_lease_it_may_have_lost(db_url: str, store: Store) -> None:
    """Frozen between its claim and its call for longer than the lease, a daemon must not
    send the call when it wakes: another daemon may have taken the request over and answered it."""
    from adapters.mock import MockAdapter
    from ledger.executor import CallContext
    from ledger.record import DbLane, Recorder
    from ledger.retry import RetryPolicy
    from ledger.scheduler import Scheduler
    from ledger.settings import load_settings

    add_requests(store, 1)
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=db_url, LEDGER_LEASE_SECONDS=2)
    lane = DbLane(1.0)
    adapter = MockAdapter()
    recorder = Recorder(store, lane, lambda _claim: None)
    context = CallContext(store, lane, recorder, RetryPolicy(0, 0, 3), 5.0, settings.prices)
    scheduler = Scheduler(context, settings, "sleeper", adapters={"mock": adapter})
    (request,) = claim(store, "sleeper", lease=2).requests
    # Claimed a whole lease ago, as seen by a process that was stopped since (monotonic time went on).
    scheduler.leases.hold((request.id, request.token), time.monotonic() - 2.0)

    async def wake_up() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            await scheduler._execute(request)
            tg.cancel_scope.cancel()

    anyio.run(wake_up)
    assert adapter.calls == 0
    assert scheduler.leases.held() == []  # cut: never renewed again; the row goes back when its lease expires


def test_a_renewal_that_sees_answered_requests_finish_cuts_nothing_off(db_url: str, store: Store) -> None:
    """A renewal runs beside the group commits: it can find a request already completed whose
    executor has not heard back yet. That request finished; it was not taken over, and the log
    must not say calls were cut off (an operator would go looking for a pause that never was)."""
    from ledger.leases import LeaseKeeper
    from ledger.record import DbLane, Recorder
    from ledger.settings import load_settings

    add_requests(store, 2)
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=db_url)
    answered, working = claim(store, "daemon").requests
    recorder = Recorder(store, DbLane(1.0), lambda _claim: None)
    keeper = LeaseKeeper(store, settings, "daemon", recorder.in_hand)
    for request in (answered, working):
        keeper.hold((request.id, request.token), time.monotonic())

    async def renewal_between_commit_and_answer() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(recorder.submit, Completed(answered, answered.attempt, "the answer", 5))
            await anyio.sleep(0)  # handed in; committed below, not yet answered
            store.record([Completed(answered, answered.attempt, "the answer", 5)])
            keys = keeper.held()
            renewed, error = await keeper._try_renew(keys, 5.0)
            assert error is None and renewed == [(working.id, working.token)]
            keeper._let_go(set(keys) - set(renewed))
            await recorder.flush()

    with kept_records("ledger", logging.WARNING) as warnings:
        anyio.run(renewal_between_commit_and_answer)
    assert [r.getMessage() for r in warnings.records if "cut off" in r.getMessage()] == []
    assert (working.id, working.token) in keeper.held()


def test_answers_handed_in_as_another_task_of_the_daemon_fails_are_still_written(db_url: str, store: Store) -> None:
    """A task of the daemon fails at the moment executors hand their paid answers in: the recorder,
    idle until then, is cancelled with everything else before it has seen them. It writes what
    it holds before it goes; the requests do not wait for their leases to expire to be called,
    and paid for, again. (Before, the recorder failed the answers' waits and went.)"""
    from ledger.record import DbLane, Recorder

    add_requests(store, 3)
    taken = claim(store, "daemon").requests
    recorder = Recorder(store, DbLane(1.0), lambda _claim: None)

    async def hand_in(request: ClaimedRequest) -> None:
        with contextlib.suppress(RecorderStopped):  # (what the recorder said before)
            await recorder.submit(Completed(request, request.attempt, f"answer {request.id}", 5))

    async def fail_as_answers_come() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            for request in taken:  # the executors hand their answers in, in this turn of the loop ...
                tg.start_soon(hand_in, request)
            raise RuntimeError("another task of the daemon failed")  # ... after this failure

    with pytest.raises(BaseExceptionGroup) as failed:
        anyio.run(fail_as_answers_come)
    assert failed.group_contains(RuntimeError, match="another task of the daemon failed")
    for request in taken:
        row = store.get_request(request.id)
        assert row is not None and (row["status"], row["raw_output"]) == ("completed", f"answer {request.id}")
