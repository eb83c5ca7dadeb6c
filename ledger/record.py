"""Recording outcomes: group commit through one database lane.

All of a daemon's database work runs in one lane (one thread at a time), so
the order of commits is the order of the events logged after them. Outcomes
that finish while a commit is running are written together by the next one:
under load a single transaction records many requests, at no added latency.

The lane tries a transaction again when the database fails in a way that
passes (a restart, a dropped connection, a deadlock), for up to
`LEDGER_DB_RETRY_SECONDS`: every store call is one transaction, so a retry
repeats all of it or none. Past that, or on an error that will not pass, the
error surfaces and the daemon stops; the recorder never leaves an executor
waiting for a commit that will not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import queue
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
from anyio.abc import TaskStatus
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay, wait_exponential

from ledger import events
from ledger.metrics import NO_METRICS, Metrics
from ledger.store import Store
from ledger.store.dialect import is_transient
from ledger.store.errors import database_unavailable
from ledger.store.rows import Claim, Completed, Failed, Outcome, Recorded, ReleasedRows, RetryLater, Written
from ledger.store.schema import one_line

T = TypeVar("T")
LOG = logging.getLogger("ledger.record")


class DbLane:
    """Runs blocking store calls in the lane's own thread, one at a time, retrying transient failures.

    The thread is the lane's, not a pool's: a call is handed over with a plain queue put
    and its answer comes back with one `call_soon_threadsafe`, so reaching the database
    costs no event-loop turns. Under load every turn waits behind the SDK work of all
    calls in flight, and a pooled worker thread (a limiter to acquire, checkpoints on the
    way in) cost three or four of them per transaction: with ten slots at zero latency
    that, not the database, was most of a group commit's round trip (issue 9).
    """

    # An idle lane's thread ends after this long; the next call starts another.
    IDLE_SECONDS = 10.0

    def __init__(self, retry_seconds: float = 60.0, *, abandon_on_cancel: bool = False) -> None:
        """`abandon_on_cancel`: a caller that gives up (a deadline) does not wait for the thread,
        which finishes on its own; only for work whose outcome nobody waits for (renewals)."""
        self._retry_seconds = retry_seconds
        self._abandon = abandon_on_cancel
        self._calls: queue.SimpleQueue[_LaneCall] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.run_within(self._retry_seconds, fn, *args, **kwargs)

    async def run_within(self, retry_seconds: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run`, retrying for `retry_seconds` instead of the lane's own window. What still fails
        with the driver's error reaches the caller as the store's `DatabaseUnavailable`."""
        with database_unavailable():
            return await self._retried(retry_seconds, functools.partial(fn, *args, **kwargs))

    async def _retried(self, retry_seconds: float, call: Callable[[], T]) -> T:
        try:  # the common case, without building a retry loop
            return await self._in_thread(call)
        except Exception as exc:
            if not is_transient(exc) or retry_seconds <= 0:
                raise
            _log_failed_try(1, exc)
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_delay(retry_seconds),
            sleep=anyio.sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        await anyio.sleep(0.05)
        async for attempt in retrying:
            with attempt:
                return await self._in_thread(call)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _in_thread(self, call: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        self._calls.put((contextvars.copy_context(), call, answer, loop))
        self._ensure_thread()
        if self._abandon:
            return await answer  # cancelled: the thread finishes the call and drops its answer
        with anyio.CancelScope(shield=True):  # a call under way is waited for, as a cancelled caller's too
            return await answer
        raise AssertionError("unreachable: a shielded wait is not cancelled")  # pragma: no cover

    def _ensure_thread(self) -> None:
        with self._thread_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ledger-db-lane", daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                context, call, answer, loop = self._calls.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._thread_lock:
                    if self._calls.empty():
                        self._thread = None
                        return
                continue
            try:
                result: Any = context.run(call)
            except BaseException as exc:
                _answer(loop, answer, None, exc)
            else:
                _answer(loop, answer, result, None)


_LaneCall = tuple[contextvars.Context, Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


def _answer(
    loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any], result: Any, error: BaseException | None
) -> None:
    def settle() -> None:
        if answer.done():  # its caller gave up (an abandoning lane)
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
        loop.call_soon_threadsafe(settle)


def _log_failed_try(attempt: int, error: BaseException) -> None:
    LOG.warning(
        "database unavailable, trying again",
        extra={"details": {"attempt": attempt, "error": one_line(error)}},
    )


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    _log_failed_try(state.attempt_number + 1, error or RuntimeError("unknown"))


class RecorderStopped(RuntimeError):
    """The recorder can no longer write: the database failed past what the lane retries."""


def _frees_slot(outcome: Outcome) -> bool:
    return isinstance(outcome, Completed | Failed) or (isinstance(outcome, RetryLater) and not outcome.hold_slot)


class SlotRefiller(Protocol):
    """What the recorder asks of the scheduler: whether and how to claim, and where a claim goes."""

    def slot_freed(self, claim: Claim | None = None) -> None: ...

    def claim_args(self) -> dict[str, Any] | None: ...


class Recorder:
    """Collects outcomes from executors and writes them in groups.

    When a group frees slots, `claim_args()` (the scheduler's) says whether and
    how to claim again; the claim then rides in the same transaction and its
    result goes to `on_slot_freed`, so a freed slot is refilled with one commit.

    Under load the lane's thread writes group after group without coming back to
    the event loop in between: what finished while one transaction ran is the next
    group, and each group's results are handed to the loop as soon as it commits
    (in commit order, one callback each). A round trip through the loop per group
    would leave the slots of the next group waiting a few loop turns for nothing.
    """

    # Groups written in one turn of the lane before the lane's other users get theirs.
    GROUPS_PER_TURN = 16
    metrics: Metrics = NO_METRICS  # the daemon's, when it serves metrics

    def __init__(
        self,
        store: Store,
        lane: DbLane,
        on_slot_freed: Callable[[Claim | None], None] = lambda _claim: None,
        claim_args: Callable[[], dict[str, Any] | None] = lambda: None,
        *,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._store = store
        self.metrics = metrics
        self._lane = lane
        self._on_slot_freed = on_slot_freed
        self._claim_args = claim_args
        # Shared with the lane's thread: outcomes waiting for a transaction, and the group in one.
        self._lock = threading.Lock()
        self._pending: list[_Waiting] = []
        self._writing: list[Outcome] = []
        # Leases (request id, token) whose outcomes were submitted and not yet answered.
        self._in_hand: dict[tuple[int, int], int] = {}
        self._wake = anyio.Event()
        self._stopped = False

    def refill_through(self, scheduler: SlotRefiller) -> None:
        """The daemon's scheduler and its recorder each need the other (executors hand outcomes
        to the recorder, which hands freed slots back to the scheduler): linked once both exist."""
        self._on_slot_freed = scheduler.slot_freed
        self._claim_args = scheduler.claim_args

    async def submit(self, outcome: Outcome) -> Written:
        """Queue an outcome and wait until it is committed.

        Raises `RecorderStopped` when it cannot be written (the recorder died). Once queued,
        the outcome is written whether or not its executor waits: by the next group commit,
        or by the recorder's last flush if the daemon stops or another of its tasks fails
        (`run`). The wait is shielded all the same: what the executor does next (its event,
        its back-off, letting go of its lease) must follow the commit.
        """
        if self._stopped:
            raise RecorderStopped("the recorder has stopped")
        written: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        key = (outcome.request.id, outcome.request.token)
        self._in_hand[key] = self._in_hand.get(key, 0) + 1
        with self._lock:
            self._pending.append(_Waiting(outcome, written))
        self._wake.set()
        try:
            with anyio.CancelScope(shield=True):  # a finished paid call is always written, or the daemon stops
                try:
                    return await written
                except _NeverWritten:
                    raise RecorderStopped("the recorder stopped before this outcome was written") from None
        finally:
            left = self._in_hand.pop(key) - 1
            if left:
                self._in_hand[key] = left
        raise AssertionError("unreachable: a shielded wait is not cancelled")  # pragma: no cover

    def unwritten(self) -> list[tuple[int, int]]:
        """Leases (request id, token) whose outcomes are in hand but not committed yet.

        A claim that reclaims expired leases must treat these as still worked on: after
        an outage longer than a lease, the answers are here, and a reclaim before they are
        written would put their requests back in the queue to be called (and paid) again.
        """
        with self._lock:
            outcomes = [w.outcome for w in self._pending] + self._writing
        return sorted({(o.request.id, o.request.token) for o in outcomes})

    def refusals_in_hand(self) -> set[str]:
        """Pools with a 429 handed in and not yet being written: a claim opens nothing in them.

        Its lesson (the pool's limit, learned in one step) is written with the next group;
        a slot opened in that pool before then, by a group commit's refill or the slow
        start, would go to a provider that has just said it is full and come back a 429
        too. The group being written is not here: its lesson precedes its own claim."""
        with self._lock:
            return {
                w.outcome.request.endpoint
                for w in self._pending
                if isinstance(w.outcome, RetryLater) and w.outcome.failure.status_code == 429
            }

    def in_hand(self) -> Collection[tuple[int, int]]:
        """Leases whose outcomes were handed in and not answered yet (written or not): a renewal
        that finds one of these no longer running sees it finish, not taken over."""
        return self._in_hand.keys()

    def notify_slot_freed(self) -> None:
        """A slot was freed outside a recorded outcome (e.g. given back after a back-off)."""
        self._on_slot_freed(None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                with anyio.CancelScope(shield=True):
                    await self.flush()
        except anyio.get_cancelled_exc_class():
            # The daemon is stopping, or another of its tasks failed: what was handed in is paid
            # for, and is written before the recorder goes. (An answer handed in as the
            # cancellation came was failed unwritten, and its request called again later.)
            with anyio.CancelScope(shield=True):
                await self.flush()
            raise
        finally:
            # Whatever stopped us (a database failure, the daemon's cancellation), nobody waits forever.
            self._stopped = True
            with self._lock:
                pending, self._pending = self._pending, []
            for waiting in pending:
                if not waiting.written.done():
                    waiting.written.set_exception(_NeverWritten())

    async def flush(self) -> None:
        """Write what is pending, a lane turn at a time, until nothing is."""
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._lane.run(self._write_groups, loop)

    def _write_groups(self, loop: asyncio.AbstractEventLoop) -> None:
        """In the lane's thread: write groups back to back, handing each one's results to the loop.

        A failed transaction puts its group back in front of what came since, so the
        lane's retry (or the next flush) writes it first; nothing is delivered for it.
        """
        for _ in range(self.GROUPS_PER_TURN):
            with self._lock:
                group, self._pending = self._pending, []
                self._writing = [w.outcome for w in group]
            if not group:
                return
            outcomes = self._writing
            try:
                recorded = self._write(outcomes, any(_frees_slot(o) for o in outcomes))
            except BaseException:
                with self._lock:
                    self._pending = group + self._pending
                raise
            finally:
                with self._lock:
                    self._writing = []
            loop.call_soon_threadsafe(self._delivered, group, recorded)

    def _write(self, outcomes: list[Outcome], frees: bool) -> Recorded:
        """One try, in the lane's thread. The claim's arguments are asked for at each try, not
        once: a retry after an outage must not claim (or renew) with what was held before it."""
        claim_args = self._claim_args() if frees else None
        with self.metrics.record_transaction():
            return self._store.record(outcomes, **(claim_args or {}))

    def _delivered(self, group: list[_Waiting], recorded: Recorded) -> None:
        """On the loop, in commit order: log what the group freed, answer its executors, refill."""
        pairs = [(w.outcome, written) for w, written in zip(group, recorded.written, strict=True)]
        self.metrics.recorded([w.outcome for w in group], recorded.written)
        freed_here = [o.request for o, w in pairs if w is Written.CANCELED or (w is Written.APPLIED and _frees_slot(o))]
        events.slots_released(ReleasedRows(freed_here, recorded.active_slots, recorded.ts_before_commit))
        for request_id, cached_from in recorded.cache_hits:
            events.cache_hit(request_id, cached_from)
        for pool in recorded.paused:
            events.quota_exhausted(pool.endpoint, pool.provider, pool.reason, pool.until)
        # A refused outcome frees nothing of ours (whoever took the row over freed the slot)
        # but still means its executor stops: wake the claim loop all the same.
        freed = any(w is not Written.APPLIED or _frees_slot(o) for o, w in pairs)
        for waiting, (_, written) in zip(group, pairs, strict=True):
            if not waiting.written.done():
                waiting.written.set_result(written)
        if freed or recorded.claim:
            self._on_slot_freed(recorded.claim)


@dataclass(frozen=True)
class _Waiting:
    """An outcome and the future its executor waits on until the outcome is committed."""

    outcome: Outcome
    written: asyncio.Future[Written]


class _NeverWritten(Exception):
    """Set on the futures of outcomes left unwritten when the recorder stops."""
