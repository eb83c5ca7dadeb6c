"""Keeping the leases a daemon works on alive, and letting go of them in time.

A claimed row is leased to this daemon for `LEDGER_LEASE_SECONDS`; past that any
daemon's claim may reclaim it and call the provider again. So the leases in hand
are renewed every third of the lease (at most ten minutes apart), and a lease whose renewal cannot be had
(the database refuses or hangs) is given up before it can lapse: its call is cut
off, so a request is never called here beside a daemon that took it over. The
row goes back to the queue when its lease expires; the daemon goes on.

Renewals run in a lane of their own: they never queue behind a transaction the
main lane is retrying, and one that hangs is given up on (its thread finishes on
its own; the database bounds its waits by the same deadline).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

import anyio

from ledger.metrics import NO_METRICS, Metrics
from ledger.record import DbLane
from ledger.settings import Settings
from ledger.store import Store
from ledger.store.errors import DatabaseUnavailable
from ledger.store.lease_ends import Held
from ledger.store.schema import one_line

LOG = logging.getLogger("ledger.leases")
# Share of LEDGER_LEASE_SECONDS a call goes on without its lease renewed before it is cut off.
LEASE_LAPSE = 0.75
# The longest between two heartbeats (and renewals), whatever the lease: a third of it, up to
# this. An enqueue on SQLite pauses for a daemon heard from within an hour (`ledger.intake`).
HEARTBEAT_AT_MOST_S = 600.0


class LeaseKeeper:
    metrics: Metrics = NO_METRICS  # the daemon's, when it serves metrics

    def __init__(
        self,
        store: Store,
        settings: Settings,
        worker_id: str,
        answered: Callable[[], Collection[Held]] = frozenset,
        *,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        """`answered`: the leases whose outcomes are with the recorder (written or about to be):
        a renewal that no longer finds those running is seeing them finish, not lost."""
        self._store = store
        self.metrics = metrics
        self._answered = answered
        self._worker = worker_id
        self._lease = settings.lease_seconds
        self._period = min(self._lease / 3, HEARTBEAT_AT_MOST_S)
        self._retry_seconds = settings.db_retry_seconds
        # Per lease in hand (request id, lease token): when it was last known to run a full
        # lease from (its claim, or the start of a renewal that covered it).
        self._held: dict[Held, float] = {}
        self._calls: dict[Held, anyio.CancelScope] = {}
        self._lane = DbLane(settings.db_retry_seconds, abandon_on_cancel=True)
        self._renewing = False  # a renewal is running in the lane's thread

    def held(self) -> list[Held]:
        """The leases this process is working on: the only ones it renews. Anything else under
        its name in the database (left by a previous process with its id) is left to expire."""
        return sorted(self._held)

    def hold(self, key: Held, leased_at: float) -> None:
        """A lease just claimed; `leased_at` (monotonic, taken before the claim wrote it) is
        no later than the moment the database started it."""
        self._held[key] = leased_at

    def may_call(self, key: Held) -> bool:
        """Is the lease known good right now? Asked just before each call goes out.

        A daemon frozen (SIGSTOP, a VM pause, swap) between its claim and its call wakes
        with a lease that may have been taken over; the keeper would cut it off on its
        next tick, but by then the request could be out and paid for twice. A lease not
        renewed within LEASE_LAPSE of the lease is cut here instead, before the call.
        """
        since = self._held.get(key)
        if since is not None and time.monotonic() - since < self._lease * LEASE_LAPSE:
            return True
        if since is not None:
            self._cut([key], logging.WARNING, "lease not known good when its call was due: call not made")
        return False

    def working_on(self, key: Held) -> anyio.CancelScope:
        """The executor of a held lease, in this scope: cancelled if the lease is about to lapse.
        The executor must call `finished` when it leaves the scope, however it leaves it: until
        then the lease is renewed."""
        scope = self._calls[key] = anyio.CancelScope()
        if key not in self._held:  # cut off before its executor even started
            scope.cancel()
        return scope

    def finished(self, key: Held) -> None:
        """The executor of `key` has ended: its lease is no longer renewed here."""
        self._calls.pop(key, None)
        self._held.pop(key, None)

    async def run(self) -> None:
        """Heartbeat and renew until cancelled (a dead process simply stops renewing)."""
        next_at = time.monotonic() + self._period
        while True:
            await anyio.sleep(max(0.0, next_at - time.monotonic()))
            keys = self.held()
            attempt_at = time.monotonic()
            # The earliest lease at risk; with none in hand, one claimed from now on.
            oldest = min((self._held.get(k, attempt_at) for k in keys), default=attempt_at)
            deadline = oldest + self._lease * LEASE_LAPSE
            renewed, error = await self._try_renew(keys, deadline - attempt_at)
            if error is None:
                for key in renewed:
                    if key in self._held:
                        self._held[key] = max(self._held[key], attempt_at)
                self._let_go(set(keys) - set(renewed))
                next_at = attempt_at + self._period
                continue
            now = time.monotonic()
            self.metrics.renewal_lost()
            LOG.error(
                "could not renew leases",
                extra={"details": {"error": error, "seconds_since_renewal": round(now - oldest, 1)}},
            )
            self._cut_off_lapsing(now)
            soonest = min(self._held.values(), default=now) + self._lease * LEASE_LAPSE
            next_at = min(now + self._period, soonest)

    async def _try_renew(self, keys: list[Held], budget: float) -> tuple[list[Held], str | None]:
        """One renewal within `budget` seconds: (the leases renewed, None) or ([], why not)."""
        if self._renewing:  # a renewal given up on is still in its thread: none piles on it
            return [], "an earlier renewal is still waiting on the database"
        if budget <= 0:
            return [], "no time left to renew"
        deadline = time.monotonic() + budget
        with anyio.move_on_after(budget):
            try:
                renewed = await self._lane.run_within(
                    min(budget, self._retry_seconds), self._renew_in_thread, keys, deadline
                )
            except DatabaseUnavailable as exc:
                return [], one_line(exc)
            except TimeoutError:
                return [], "the renewal did not finish in time"
            return renewed, None
        return [], "the renewal did not finish in time"

    def _renew_in_thread(self, keys: list[Held], deadline: float) -> list[Held]:
        """In the lane's thread, each try bounded by what is left until `deadline`: a renewal
        that landed after its caller gave up would revive leases already let go."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._renewing = True
        try:
            return self._store.renew_leases(self._worker, self._lease, keys, wait_at_most=left)
        finally:
            self._renewing = False

    def _let_go(self, lost: set[Held]) -> None:
        """Leases held here that the renewal did not find ours any more (taken over after a pause
        longer than the lease, or just finished): whatever call is still running stops."""
        answered = self._answered()
        self._cut(
            [key for key in lost if key in self._held and key not in answered],
            logging.WARNING,
            "leases no longer ours (taken over): calls cut off",
        )

    def _cut_off_lapsing(self, now: float) -> None:
        """Cancel the calls (or back-offs) of leases unrenewed for LEASE_LAPSE of the lease."""
        lapsing = [key for key, since in self._held.items() if now - since >= self._lease * LEASE_LAPSE]
        oldest = min((self._held[key] for key in lapsing), default=now)
        self._cut(
            lapsing,
            logging.ERROR,
            "leases not renewed in time: calls cut off, their requests go back to the queue when the leases expire",
            seconds_since_renewal=round(now - oldest, 1),
        )

    def _cut(self, keys: list[Held], level: int, message: str, **details: object) -> None:
        """Renew these leases no more and cancel whatever their executors are doing."""
        for key in keys:
            del self._held[key]
            scope = self._calls.get(key)
            if scope is not None:
                scope.cancel()
        if keys:
            self.metrics.leases_cut(len(keys))
            ids = sorted(request_id for request_id, _ in keys)[:50]
            LOG.log(level, message, extra={"details": {"count": len(keys), "request_ids": ids, **details}})

    async def settled(self, timeout: float) -> None:
        """Wait (up to `timeout`) for a renewal still running in its thread, e.g. before the worker
        retires: a heartbeat landing after that would count a stopped daemon as live."""
        with anyio.move_on_after(timeout):
            while self._renewing:
                await anyio.sleep(0.01)
