"""The claim loop: a claimed row is an occupied slot.

Each pass asks the store for as many due requests as the global limit and the
pools allow (the store counts `running` rows inside a serialised transaction,
so the limits hold across every daemon sharing the database), starts one
executor per claimed request, and otherwise sleeps until a local slot frees or
the poll interval passes (slots freed by other daemons are seen by polling).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup

from adapters.base import Adapter
from adapters.registry import make_adapter
from ledger import events
from ledger.executor import CallContext, execute
from ledger.leases import LeaseKeeper
from ledger.metrics import NO_METRICS, Metrics
from ledger.record import RecorderStopped
from ledger.settings import Settings
from ledger.store.pools import RAMP_PACE_S
from ledger.store.rows import AttemptFailure, Claim, ClaimedRequest, Failed, ReleasedRows, Written
from ledger.waits import IdleTakers, first_done

LOG = logging.getLogger("ledger.scheduler")


@dataclass
class SchedulerState:
    in_flight: int = 0
    claimed_total: int = 0
    reclaimed_total: int = 0


class Scheduler:
    metrics: Metrics = NO_METRICS  # the daemon's, when it serves metrics

    def __init__(
        self,
        ctx: CallContext,
        settings: Settings,
        worker_id: str,
        adapters: dict[str, Adapter] | None = None,
        *,
        metrics: Metrics = NO_METRICS,
        idle: Callable[[], None] = lambda: None,
        ready: Callable[[], None] = lambda: None,
    ) -> None:
        """`idle` is called when the last call in flight has ended (the daemon steps its jobs
        then); `ready` once the adapters the queued work needs are built, before the first claim."""
        self.ctx = ctx
        self.metrics = metrics
        self.settings = settings
        self.worker_id = worker_id
        self.state = SchedulerState()
        self._adapters: dict[str, Adapter] = dict(adapters or {})
        self._building = anyio.Lock()
        self._wake = anyio.Event()
        self._all_done = anyio.Event()
        self._all_done.set()
        self._tg: TaskGroup | None = None
        # Executors that finished a request wait here for the next one (see `_start`).
        self._idle_executors = IdleTakers[ClaimedRequest]()
        self.leases = LeaseKeeper(ctx.store, settings, worker_id, ctx.recorder.in_hand, metrics=metrics)
        self._stopping = False
        self._stop = anyio.Event()
        self._last_reclaim = -float("inf")
        self.idle = idle
        self.ready = ready
        self.limits: dict[str, Any] = {
            "lease_seconds": settings.lease_seconds,
            "global_limit": settings.max_concurrent_llm_calls,
            "pool_limit": settings.pool_limit,
            "max_attempts": settings.retry_max_attempts,
            "max_claims": settings.max_concurrent_llm_calls,
            "daily_budget": settings.daily_budget_usd,
        }

    def claim_args(self) -> dict[str, Any] | None:
        """For the recorder: claim in its transaction unless we are stopping."""
        if self._stopping or self._tg is None or self._stop.is_set():  # no new call after SIGTERM
            return None
        return {"claim_for": self.worker_id, **self.limits_now()}

    def limits_now(self) -> dict[str, Any]:
        """Claim limits, asking for a sweep of expired leases every quarter lease."""
        now = time.monotonic()
        reclaim = now - self._last_reclaim >= self.settings.lease_seconds / 4
        refused = self.ctx.recorder.refusals_in_hand()
        limits = {**self.limits, "hold": refused} if refused else self.limits
        if not reclaim:
            return {**limits, "reclaim": False}
        self._last_reclaim = now
        # Leases in hand include those whose answers wait to be written: never reclaimed here.
        held = sorted(set(self.leases.held()) | set(self.ctx.recorder.unwritten()))
        return {**limits, "reclaim": True, "held": held}

    def look_now(self) -> None:
        """Claim (or, with until_idle, check for the end) at once instead of at the next poll:
        a job step queued requests, or the job or batch loop has ended."""
        self._wake.set()

    def slot_freed(self, claim: Claim | None = None) -> None:
        """Slots came free. With the claim the recorder made in the same transaction, they are
        already refilled as far as the limits allow; without one, the claim loop claims."""
        if claim is not None and self._tg is not None:
            self._accept(claim, self._tg)
        else:
            self._wake.set()

    async def adapter_for(self, provider: str) -> Adapter:
        """The provider's adapter, built once, off the event loop.

        Importing an SDK and building its client takes ~0.5-1 s; done on the
        loop it would stall every call in flight while slots are held.
        """
        if provider not in self._adapters:
            async with self._building:
                if provider not in self._adapters:
                    self._adapters[provider] = await anyio.to_thread.run_sync(make_adapter, provider, self.settings)
        return self._adapters[provider]

    async def warm_adapters(self) -> None:
        """Build the adapters the queued work needs before the first claim, so no slot waits on an import."""
        for provider in sorted(await self.ctx.lane.run(self.ctx.store.online_providers)):
            try:
                await self.adapter_for(provider)
            except ValueError as exc:  # misconfigured: said once here; its requests end with the reason when claimed
                LOG.error(
                    "provider not configured: its requests end config_error",
                    extra={"details": {"provider": provider, "error": str(exc)}},
                )

    async def close_adapters(self) -> None:
        for adapter in self._adapters.values():
            await adapter.aclose()

    async def claim_once(self, tg: TaskGroup) -> int:
        # The limits are read at each try (the held leases change while a retry waits).
        claim = await self.ctx.lane.run(self._claim)
        taken = self._accept(claim, tg)
        if claim.ramping:  # slow start: let a refusal of the slot just opened come back first
            await anyio.sleep(RAMP_PACE_S)
        return taken

    def _claim(self) -> Claim:
        with self.metrics.claim_transaction():
            return self.ctx.store.claim(self.worker_id, **self.limits_now())

    def _accept(self, claim: Claim, tg: TaskGroup) -> int:
        """Announce and start what a claim took; returns how many."""
        self.metrics.claimed(claim)
        if claim.reclaimed.requests:
            self.state.reclaimed_total += len(claim.reclaimed.requests)
            self.announce_released(claim.reclaimed, "reclaimed expired leases")
        first = claim.active_slots - len(claim.requests)
        announce = events.wanted(logging.INFO)
        for i, request in enumerate(claim.requests, start=1):
            if announce:
                events.acquired(request, first + i)
            self._start(tg, request, claim.leased_at)
        return len(claim.requests)

    @staticmethod
    def announce_released(released: ReleasedRows, why: str) -> None:
        """`released` events for slots freed without an outcome of ours (reclaim, restart, stop)."""
        events.slots_released(released)
        if released.requests:
            ids = [r.id for r in released.requests]
            LOG.warning(why, extra={"details": {"count": len(ids), "request_ids": ids[:50]}})

    async def run(self, tg: TaskGroup, *, until_idle: bool, stop: anyio.Event) -> None:
        """Claim and start work until `stop` is set (or, with until_idle, nothing is left)."""
        self._tg, self._stop = tg, stop
        await self.ctx.lane.run(self.ctx.store.renew_leases, self.worker_id, self.settings.lease_seconds)
        # A previous process under this worker id (a restart with a fixed --worker-id) left these
        # claimed: nobody is calling them, so they go back now rather than when their leases expire.
        leftover = await self.ctx.lane.run(
            self.ctx.store.release_worker,
            self.worker_id,
            self.settings.retry_max_attempts,
            "a previous process with this worker id stopped before the call finished",
        )
        self.announce_released(leftover, "released what a previous process with this worker id held")
        await self.warm_adapters()
        self.ready()
        try:
            await self._claim_loop(tg, until_idle=until_idle, stop=stop)
        finally:
            self._stopping = True
            self._idle_executors.release()  # executors waiting for a next request end; running ones finish theirs

    async def _claim_loop(self, tg: TaskGroup, *, until_idle: bool, stop: anyio.Event) -> None:
        while not stop.is_set():
            self._wake = anyio.Event()
            if await self.claim_once(tg):
                continue
            # Idle means no batch work either: a batch request may still come to the online path
            # (a provider without a batch API), and the daemon ends when both loops are done.
            if until_idle and self.state.in_flight == 0 and not await self.ctx.lane.run(self.ctx.store.has_work):
                return
            with anyio.move_on_after(self.settings.poll_interval):
                await first_done(self._wake.wait, stop.wait)

    def _start(self, tg: TaskGroup, request: ClaimedRequest, leased_at: float) -> None:
        """Hand the request to an executor that is waiting for one, or start a new executor.

        An executor task serves request after request: starting a task per request cost
        the event loop more than the rest of the request's bookkeeping together,
        and at zero latency the loop's time is the daemon's throughput. At most as many
        executors exist as calls were ever in flight at once."""
        self.leases.hold((request.id, request.token), leased_at)
        if self.state.in_flight == 0:
            self._all_done = anyio.Event()
        self.state.in_flight += 1
        self.state.claimed_total += 1
        if not self._idle_executors.give(request):  # none waits (or the claim loop has ended)
            tg.start_soon(self._executor, request, name="executor")

    async def _executor(self, request: ClaimedRequest) -> None:
        """Run `request`, then each one handed over next, until the claim loop has ended
        (`IdleTakers.release`: a waiting executor, and any that comes to wait later, gets None)."""
        next_request: ClaimedRequest | None = request
        while next_request is not None:
            await self._execute(next_request)
            next_request = await self._idle_executors.wait()

    async def _execute(self, request: ClaimedRequest) -> None:
        key = (request.id, request.token)
        try:
            with self.leases.working_on(key) as scope:  # cut off if its lease is lapsing (or its call's deadline)
                await self._call(request, scope)
        except RecorderStopped:
            return  # the recorder's own failure stops the daemon; this request's lease will expire
        finally:
            self.leases.finished(key)
            self.state.in_flight -= 1
            # The slot this request freed was refilled by the recorder's claim (or, when freed
            # outside an outcome, `slot_freed` woke the loop): only "all done" is news here.
            if self.state.in_flight == 0:
                self._all_done.set()
                self._wake.set()
                self.idle()

    async def _call(self, request: ClaimedRequest, scope: anyio.CancelScope) -> None:
        try:
            adapter = await self.adapter_for(request.provider)
        except ValueError as exc:  # e.g. a provider with no base URL configured
            failure = AttemptFailure(None, "config_error", str(exc), 0)
            if await self.ctx.recorder.submit(Failed(request, request.attempt, failure)) is Written.APPLIED:
                events.failed(request, None, "config_error", str(exc), request.attempt, 0.0)
            return
        await execute(request, adapter, self.ctx, scope, lambda: self.leases.may_call((request.id, request.token)))

    async def wait_all_done(self) -> None:
        await self._all_done.wait()
