"""Process lifecycle: start, run the scheduler, stop gracefully on SIGTERM/SIGINT.

On the first signal the daemon stops claiming, lets calls in flight finish for
up to `LEDGER_SHUTDOWN_GRACE` seconds, then cuts the rest off and gives their
slots back to the queue. A second signal skips the grace period. A process that
dies without any of this (kill -9) loses nothing either: its leases expire and
the next claim by any daemon puts those rows back in the queue.
"""

from __future__ import annotations

import gc
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
from sqlalchemy.exc import DBAPIError

from adapters.base import Adapter
from adapters.batch_interface import BatchAdapter
from ledger import events
from ledger.batches import BatchWorker
from ledger.executor import CallContext
from ledger.jobs import Coordinator
from ledger.metrics import serve_metrics
from ledger.record import DbLane, Recorder
from ledger.retry import RetryPolicy
from ledger.scheduler import Scheduler
from ledger.settings import Settings
from ledger.store import Store
from ledger.store.schema import one_line
from ledger.waits import first_done


class DatabaseFailed(RuntimeError):
    """The database failed past `LEDGER_DB_RETRY_SECONDS` (or in a way that will not pass); one line."""


@dataclass(frozen=True)
class DaemonReport:
    claimed: int
    reclaimed: int
    released_at_stop: int
    wall_s: float
    stopped_by_signal: bool


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


# Allocations (less deallocations) of container objects between two passes of the cyclic
# collector over the youngest generation while a daemon runs; Python's default is 700.
YOUNG_COLLECTION_EVERY = 10_000


@dataclass
class _Tuning:
    """The collector's settings as the first daemon in the process found them, and as it set them."""

    daemons: int = 0
    found: tuple[int, int, int] = (700, 10, 10)
    tuned: tuple[int, int, int] = (700, 10, 10)
    froze: bool = False

    def freeze_what_is_built(self) -> None:
        """The daemon has built what it keeps for the run (SDK clients, compiled statements,
        some 170,000 objects more with the openai and anthropic adapters): out of reach too."""
        with _tuning_lock:
            if self.froze:
                gc.freeze()


_tuning, _tuning_lock = _Tuning(), threading.Lock()


@contextmanager
def collector_for_a_long_run() -> Iterator[None]:
    """While a daemon runs: what was allocated before it started (imported modules, SQLAlchemy's
    tables, some 110,000-125,000 objects), and what it builds to keep (`freeze_what_is_built`),
    is out of the cyclic collector's reach (`gc.freeze`), and its youngest generation is
    collected every `YOUNG_COLLECTION_EVERY` allocations. At zero latency the collector's passes
    were 7.6 % of a daemon's instructions (callgrind, 1,000 requests on SQLite; one full pass
    over those objects was most of it), and 3-14 % fewer with this (decision 79). A request's
    garbage is freed by reference counting as before; cycles (a failed call's exception and
    traceback) wait up to 9,300 allocations longer. Process-wide, so only the first of several
    daemons in one process tunes it and the last one out sets it back: the threshold only if it
    is still the daemon's, and the freeze only if the daemon made it (a program that had frozen
    objects itself keeps them frozen and gets nothing frozen by the daemon; one that freezes
    objects while a daemon runs sees them unfrozen with the daemon's). A collector switched off
    with a threshold of 0 stays off."""
    with _tuning_lock:
        _tuning.daemons += 1
        if _tuning.daemons == 1:
            _tuning.found = found = gc.get_threshold()
            _tuning.froze = gc.get_freeze_count() == 0
            if _tuning.froze:
                gc.freeze()
            _tuning.tuned = (max(found[0], YOUNG_COLLECTION_EVERY) if found[0] else 0, *found[1:])
            gc.set_threshold(*_tuning.tuned)
    try:
        yield
    finally:
        with _tuning_lock:
            _tuning.daemons -= 1
            if _tuning.daemons == 0:
                if gc.get_threshold() == _tuning.tuned:
                    gc.set_threshold(*_tuning.found)
                if _tuning.froze:
                    gc.unfreeze()
                    _tuning.froze = False


async def run_daemon(
    settings: Settings,
    *,
    until_idle: bool = False,
    worker_id: str | None = None,
    adapters: dict[str, Adapter] | None = None,
    batch_adapters: dict[str, BatchAdapter] | None = None,
    stop: anyio.Event | None = None,
    handle_signals: bool = True,
) -> DaemonReport:
    """Claim, call and record until stopped (or, with `until_idle`, until nothing is left)."""
    with collector_for_a_long_run():
        return await _run(settings, until_idle, worker_id, adapters, batch_adapters, stop, handle_signals)


async def _run(
    settings: Settings,
    until_idle: bool,
    worker_id: str | None,
    adapters: dict[str, Adapter] | None,
    batch_adapters: dict[str, BatchAdapter] | None,
    stop: anyio.Event | None,
    handle_signals: bool,
) -> DaemonReport:
    worker = worker_id or default_worker_id()
    # The lane retries dropped connections; a session of ours frozen inside a transaction (the
    # claim lock held) is ended by the server within a quarter lease (at least 1 s), so the
    # other daemons go on.
    idle_bound = max(settings.lease_seconds / 4, 1.0)
    store = Store(
        settings.database_url, ping_on_checkout=False, idle_in_transaction_s=idle_bound, background_checkpoints=True
    )
    store.pool_probe_seconds = settings.pool_probe_seconds
    store.pool_rules = settings.pool_rules
    try:
        served = serve_metrics(settings)  # None without a metrics port: nothing listens
    except BaseException:
        store.close()
        raise
    lane = DbLane(settings.db_retry_seconds)
    stop = stop or anyio.Event()
    started = time.monotonic()
    signalled = False
    scheduler: Scheduler
    recorder = Recorder(store, lane, lambda claim: scheduler.slot_freed(claim), lambda: scheduler.claim_args())
    policy = RetryPolicy(settings.retry_initial_delay, settings.retry_max_delay, settings.retry_max_attempts)
    scheduler = Scheduler(
        CallContext(
            store,
            lane,
            recorder,
            policy,
            settings.llm_call_timeout,
            settings.prices,
            settings.keeps_response,
            settings.quota_recheck_seconds,
            settings.rate_limit_give_up_seconds,
        ),
        settings,
        worker,
        adapters,
    )
    if served is not None:
        recorder.metrics = scheduler.metrics = scheduler.leases.metrics = served.metrics
    batch_worker = BatchWorker(store, lane, settings, worker, batch_adapters)
    if served is not None:
        batch_worker.fallback.metrics = served.metrics
    coordinator = Coordinator(store, lane, settings)
    scheduler.idle = coordinator.calls_answered
    scheduler.ready = _tuning.freeze_what_is_built  # what it built to keep is out of the collector's reach
    events.started(
        worker_id=worker,
        max_concurrent_llm_calls=settings.max_concurrent_llm_calls,
        pool_limits=settings.pool_limits,
        default_pool_limit=settings.default_pool_limit,
        retry_max_attempts=settings.retry_max_attempts,
        retry_initial_delay=settings.retry_initial_delay,
        retry_max_delay=settings.retry_max_delay,
        llm_call_timeout=settings.llm_call_timeout,
        lease_seconds=settings.lease_seconds,
        provider_batch_size=settings.provider_batch_size,
        provider_batch_wait=settings.provider_batch_wait,
        batch_poll_interval=settings.batch_poll_interval,
        job_capacity=settings.job_capacity,
        daily_budget_usd=settings.daily_budget_usd,
        database=store.engine.url.render_as_string(hide_password=True),
        metrics=served.url if served is not None else None,
    )

    no_grace = anyio.Event()
    renewing = anyio.CancelScope()

    async def keep_leases() -> None:
        with renewing:
            await scheduler.leases.run()

    async def watch_signals() -> None:
        nonlocal signalled
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for _ in received:
                if signalled:  # second signal: no more grace
                    no_grace.set()
                signalled = True
                stop.set()

    batch_done = anyio.Event()

    async def run_batches() -> None:
        try:
            await batch_worker.run(stop=stop, until_idle=until_idle, progressed=coordinator.look_now)
        finally:
            batch_done.set()
            scheduler.look_now()

    try:
        async with anyio.create_task_group() as services:
            await services.start(recorder.run)
            services.start_soon(keep_leases)
            if handle_signals:
                services.start_soon(watch_signals)
            if served is not None:
                # A lane of its own: the reading never waits behind, nor holds up, the recorder's commits.
                reads = DbLane(abandon_on_cancel=True)
                services.start_soon(
                    served.metrics.keep_reading,
                    lambda: reads.run_within(0, store.ledger_counts),
                    settings.metrics_interval,
                )
            async with anyio.create_task_group() as work:
                work.start_soon(run_batches)
                work.start_soon(lambda: coordinator.run(stop=stop, until_idle=until_idle, stepped=scheduler.look_now))
                await scheduler.run(work, until_idle=until_idle, stop=stop)
                coordinator.look_now()  # nothing left to claim: the coordinator need not wait for its poll
                if stop.is_set():
                    # Calls in flight and the batch step under way get the grace period; submitted
                    # batches stay with the provider and are picked up again at the next start.
                    with anyio.move_on_after(settings.shutdown_grace):
                        await first_done(scheduler.wait_all_done, no_grace.wait)
                        await first_done(batch_done.wait, no_grace.wait)
                    work.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                await recorder.flush()
                renewing.cancel()  # no heartbeat may land after this worker retires
                await scheduler.leases.settled(timeout=5)
                released = await lane.run(store.release_worker, worker, settings.retry_max_attempts)
                await lane.run(store.retire_worker, worker)
                scheduler.announce_released(released, "gave back slots of calls cut off at stop")
                await scheduler.close_adapters()
            stop.set()
            services.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        failed, other = group.split(DBAPIError)
        if failed is None or other is not None:  # anything else is a bug: show all of it
            raise
        cause = _first_leaf(failed)
        raise DatabaseFailed(
            f"database failed, daemon stopped: {one_line(cause)} "
            "(requests in flight go back to the queue when their leases expire)"
        ) from cause
    finally:
        if served is not None:
            served.close()
        store.close()
    return DaemonReport(
        scheduler.state.claimed_total,
        scheduler.state.reclaimed_total,
        len(released.requests),
        time.monotonic() - started,
        signalled,
    )


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
