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

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskStatus
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay, wait_exponential

from ledger import events
from ledger.metrics import NO_METRICS, Metrics
from ledger.store import Store
from ledger.store.dialect import is_transient
from ledger.store.rows import Claim, Completed, Failed, Outcome, Recorded, ReleasedRows, RetryLater, Written
from ledger.store.schema import one_line

T = TypeVar("T")
LOG = logging.getLogger("ledger.record")


class DbLane:
    """Runs blocking store calls in a worker thread, one at a time, retrying transient failures."""

    def __init__(self, retry_seconds: float = 60.0, *, abandon_on_cancel: bool = False) -> None:
        """`abandon_on_cancel`: a caller that gives up (a deadline) does not wait for the thread,
        which finishes on its own; only for work whose outcome nobody waits for (renewals)."""
        self._limiter = anyio.CapacityLimiter(1)
        self._retry_seconds = retry_seconds
        self._abandon = abandon_on_cancel

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.run_within(self._retry_seconds, fn, *args, **kwargs)

    async def run_within(self, retry_seconds: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`run`, retrying for `retry_seconds` instead of the lane's own window."""
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.05, max=2.0),
            stop=stop_after_delay(retry_seconds),
            sleep=anyio.sleep,
            before_sleep=_log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await anyio.to_thread.run_sync(
                    lambda: fn(*args, **kwargs), limiter=self._limiter, abandon_on_cancel=self._abandon
                )
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    LOG.warning(
        "database unavailable, trying again",
        extra={"details": {"attempt": state.attempt_number, "error": one_line(error)}},
    )


class RecorderStopped(RuntimeError):
    """The recorder can no longer write: the database failed past what the lane retries."""


def _frees_slot(outcome: Outcome) -> bool:
    return isinstance(outcome, Completed | Failed) or (isinstance(outcome, RetryLater) and not outcome.hold_slot)


class Recorder:
    """Collects outcomes from executors and writes them in groups.

    When a group frees slots, `claim_args()` (the scheduler's) says whether and
    how to claim again; the claim then rides in the same transaction and its
    result goes to `on_slot_freed`, so a freed slot is refilled with one commit.
    """

    metrics: Metrics = NO_METRICS  # the daemon's, when it serves metrics

    def __init__(
        self,
        store: Store,
        lane: DbLane,
        on_slot_freed: Callable[[Claim | None], None],
        claim_args: Callable[[], dict[str, Any] | None] = lambda: None,
    ) -> None:
        self._store = store
        self._lane = lane
        self._on_slot_freed = on_slot_freed
        self._claim_args = claim_args
        # Per outcome: its event and a one-item box for what became of it (None: never written).
        self._pending: list[tuple[Outcome, anyio.Event, list[Written | None]]] = []
        self._writing: list[Outcome] = []  # the group whose transaction is under way
        self._wake = anyio.Event()
        self._stopped = False

    async def submit(self, outcome: Outcome) -> Written:
        """Queue an outcome and wait until it is committed.

        Raises `RecorderStopped` when it cannot be written (the recorder died).
        """
        if self._stopped:
            raise RecorderStopped("the recorder has stopped")
        done, box = anyio.Event(), list[Written | None]([None])
        self._pending.append((outcome, done, box))
        self._wake.set()
        with anyio.CancelScope(shield=True):  # a finished paid call is always written, or the daemon stops
            await done.wait()
        if box[0] is None:
            raise RecorderStopped("the recorder stopped before this outcome was written")
        return box[0]

    def unwritten(self) -> list[tuple[int, int]]:
        """Leases (request id, token) whose outcomes are in hand but not committed yet.

        A claim that reclaims expired leases must treat these as still worked on: after
        an outage longer than a lease, the answers are here, and a reclaim before they are
        written would put their requests back in the queue to be called (and paid) again.
        """
        outcomes = [item[0] for item in self._pending] + self._writing
        return sorted({(o.request.id, o.request.token) for o in outcomes})

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
        finally:
            # Whatever stopped us (a database failure, the daemon's cancellation), nobody waits forever.
            self._stopped = True
            pending, self._pending = self._pending, []
            for _, done, _box in pending:
                done.set()

    def _write(self, outcomes: list[Outcome], frees: bool) -> Recorded:
        """One try, in the lane's thread. The claim's arguments are asked for at each try, not
        once: a retry after an outage must not claim (or renew) with what was held before it."""
        claim_args = self._claim_args() if frees else None
        with self.metrics.record_transaction():
            return self._store.record(outcomes, **(claim_args or {}))

    async def flush(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            outcomes = self._writing = [item[0] for item in group]
            try:
                recorded = await self._lane.run(self._write, outcomes, any(_frees_slot(o) for o in outcomes))
            except BaseException:
                self._pending = group + self._pending  # still unwritten: woken as such by run()
                raise
            finally:
                self._writing = []
            pairs = list(zip(outcomes, recorded.written, strict=True))
            self.metrics.recorded(outcomes, recorded.written)
            freed_here = [
                o.request for o, w in pairs if w is Written.CANCELED or (w is Written.APPLIED and _frees_slot(o))
            ]
            events.slots_released(ReleasedRows(freed_here, recorded.active_slots, recorded.ts_before_commit))
            # A refused outcome frees nothing of ours (whoever took the row over freed the slot)
            # but still means its executor stops: wake the claim loop all the same.
            freed = any(w is not Written.APPLIED or _frees_slot(o) for o, w in pairs)
            for (_, done, box), (_, written) in zip(group, pairs, strict=True):
                box[0] = written
                done.set()
            if freed or recorded.claim:
                self._on_slot_freed(recorded.claim)
