"""Delivery `auto` at its deadline less LEDGER_DEADLINE_MARGIN_SECONDS, as the batch worker's
first move each cycle: a request still waiting for a batch goes online; a batch holding one is
marked (`fallback_at`), and its next poll (due now) cancels it and takes what it has not
answered online (ledger/batches.py, ledger/store/deadlines.py)."""

from __future__ import annotations

from ledger import events
from ledger.metrics import NO_METRICS, Metrics
from ledger.record import DbLane
from ledger.settings import Settings
from ledger.store import Store


class DeadlineFallback:
    """One per batch worker."""

    def __init__(self, store: Store, lane: DbLane, settings: Settings, metrics: Metrics = NO_METRICS) -> None:
        self.store = store
        self.lane = lane
        self.margin = settings.deadline_margin_seconds
        self.metrics = metrics  # the daemon's, when it serves metrics

    async def check(self) -> bool:
        """Move what has reached its margin; True if anything was done. Most cycles find nothing
        in one indexed read and write nothing."""
        if not await self.lane.run(self.store.deadlines_due, self.margin):
            return False
        moved = await self.lane.run(self.store.auto_online_now, self.margin)
        self.said(None, moved)
        marked = await self.lane.run(self.store.mark_fallbacks, self.margin)
        return bool(moved or marked)

    def said(self, batch_id: int | None, moved: dict[str, int]) -> None:
        """The `deadline_fallback` event and metric, per pool, for requests moved online."""
        for pool, count in moved.items():
            events.deadline_fallback(batch_id, pool, count)
            self.metrics.deadline_fallbacks(pool, count)
