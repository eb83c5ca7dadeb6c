"""Recording outcomes: group commit through one database lane.

All of a daemon's database work runs in one lane (one thread at a time), so
the order of commits is the order of the events logged after them. Outcomes
that finish while a commit is running are written together by the next one:
under load a single transaction records many requests, at no added latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskStatus

from ledger import events
from ledger.store import Store
from ledger.store.rows import Claim, Completed, Failed, Outcome, Recorded, RetryLater

T = TypeVar("T")


class DbLane:
    """Runs blocking store calls in a worker thread, one at a time."""

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), limiter=self._limiter)


def _frees_slot(outcome: Outcome) -> bool:
    return isinstance(outcome, Completed | Failed) or (isinstance(outcome, RetryLater) and not outcome.hold_slot)


class Recorder:
    """Collects outcomes from executors and writes them in groups.

    When a group frees slots, `claim_args()` (the scheduler's) says whether and
    how to claim again; the claim then rides in the same transaction and its
    result goes to `on_slot_freed`, so a freed slot is refilled with one commit.
    """

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
        self._pending: list[tuple[Outcome, anyio.Event, list[bool]]] = []
        self._wake = anyio.Event()

    async def submit(self, outcome: Outcome) -> bool:
        """Queue an outcome and wait until it is committed; False if the fence refused it."""
        done, result = anyio.Event(), [False]
        self._pending.append((outcome, done, result))
        self._wake.set()
        with anyio.CancelScope(shield=True):  # a finished paid call is always written
            await done.wait()
        return result[0]

    def notify_slot_freed(self) -> None:
        """A slot was freed outside a recorded outcome (e.g. given back after a back-off)."""
        self._on_slot_freed(None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            with anyio.CancelScope(shield=True):
                await self.flush()

    async def flush(self) -> None:
        while self._pending:
            group, self._pending = self._pending, []
            outcomes = [item[0] for item in group]
            claim_args = self._claim_args() if any(_frees_slot(o) for o in outcomes) else None
            recorded: Recorded = await self._lane.run(self._store.record, outcomes, **(claim_args or {}))
            freed = False
            for (outcome, done, result), applied in zip(group, recorded.applied, strict=True):
                result[0] = applied
                if _frees_slot(outcome) or not applied:
                    freed = True
                    request = outcome.request
                    events.released(
                        request.id,
                        request.agent,
                        request.dimension,
                        recorded.active_slots,
                        ts=recorded.ts_before_commit,
                    )
                done.set()
            if freed or recorded.claim:
                self._on_slot_freed(recorded.claim)
