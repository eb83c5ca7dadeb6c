"""Process lifecycle: start, run the scheduler, stop gracefully on SIGTERM/SIGINT.

On the first signal the daemon stops claiming, lets calls in flight finish for
up to `LEDGER_SHUTDOWN_GRACE` seconds, then cuts the rest off and gives their
slots back to the queue. A second signal skips the grace period. A process that
dies without any of this (kill -9) loses nothing either: its leases expire and
the next claim by any daemon puts those rows back in the queue.
"""

from __future__ import annotations

import functools
import gc
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup, TaskStatus

from adapters.base import Adapter
from adapters.batch_interface import BatchAdapter
from ledger import events
from ledger.batches import BatchWorker
from ledger.executor import CallContext
from ledger.jobs import Coordinator
from ledger.metrics import NO_METRICS, ServedMetrics, serve_metrics
from ledger.record import DbLane, Recorder
from ledger.retry import RetryPolicy
from ledger.scheduler import Scheduler
from ledger.settings import Settings
from ledger.store import Store
from ledger.store.errors import DatabaseUnavailable
from ledger.store.rows import ReleasedRows
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
    store = _open_store(settings)
    try:
        served = serve_metrics(settings)  # None without a metrics port: nothing listens
    except BaseException:
        store.close()
        raise
    started = time.monotonic()
    daemon = _Daemon.build(settings, store, served, worker, adapters, batch_adapters, stop or anyio.Event(), until_idle)
    try:
        async with anyio.create_task_group() as services:
            await daemon.start_services(services, handle_signals)
            # Announced once the signals are watched: a supervisor that stops the daemon as soon as
            # it reads the start line gets a graceful stop, never the default SIGTERM's kill.
            _announce(settings, worker, store, served)
            await daemon.work()
            released = await daemon.shut_down()
            daemon.stop.set()
            services.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        cause = _database_failure(group)
        if cause is None:  # anything else is a bug: show all of it
            raise
        raise DatabaseFailed(
            f"database failed, daemon stopped: {one_line(cause)} "
            "(requests in flight go back to the queue when their leases expire)"
        ) from cause
    finally:
        if served is not None:
            served.close()
        store.close()
    state = daemon.scheduler.state
    return DaemonReport(
        state.claimed_total, state.reclaimed_total, len(released.requests), time.monotonic() - started, daemon.signalled
    )


def _open_store(settings: Settings) -> Store:
    """The daemon's store. The lane retries dropped connections; a session of ours frozen inside
    a transaction (the claim lock held) is ended by the server within a quarter lease (at least
    1 s), so the other daemons go on."""
    return Store(
        settings.database_url,
        ping_on_checkout=False,
        idle_in_transaction_s=max(settings.lease_seconds / 4, 1.0),
        background_checkpoints=True,
        prepared_hot_statements=True,
        pool_rules=settings.pool_rules,
        pool_probe_seconds=settings.pool_probe_seconds,
    )


def _announce(settings: Settings, worker: str, store: Store, served: ServedMetrics | None) -> None:
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


@dataclass
class _Daemon:
    """The parts of one run, built whole by `build`, and the steps that run and stop them."""

    settings: Settings
    worker: str
    store: Store
    lane: DbLane
    served: ServedMetrics | None
    recorder: Recorder
    scheduler: Scheduler
    batch_worker: BatchWorker
    coordinator: Coordinator
    stop: anyio.Event
    until_idle: bool
    signalled: bool = False
    no_grace: anyio.Event = field(default_factory=anyio.Event)  # a second signal: no more grace
    batch_done: anyio.Event = field(default_factory=anyio.Event)
    renewing: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    @classmethod
    def build(
        cls,
        settings: Settings,
        store: Store,
        served: ServedMetrics | None,
        worker: str,
        adapters: dict[str, Adapter] | None,
        batch_adapters: dict[str, BatchAdapter] | None,
        stop: anyio.Event,
        until_idle: bool,
    ) -> _Daemon:
        metrics = served.metrics if served is not None else NO_METRICS
        lane = DbLane(settings.db_retry_seconds)
        recorder = Recorder(store, lane, metrics=metrics)
        policy = RetryPolicy(settings.retry_initial_delay, settings.retry_max_delay, settings.retry_max_attempts)
        context = CallContext(
            store,
            lane,
            recorder,
            policy,
            settings.llm_call_timeout,
            settings.prices,
            settings.keeps_response,
            settings.quota_recheck_seconds,
            settings.rate_limit_give_up_seconds,
        )
        coordinator = Coordinator(store, lane, settings)
        # `ready`: what the scheduler built to keep is out of the collector's reach.
        scheduler = Scheduler(
            context,
            settings,
            worker,
            adapters,
            metrics=metrics,
            idle=coordinator.calls_answered,
            ready=_tuning.freeze_what_is_built,
        )
        recorder.refill_through(scheduler)
        batch_worker = BatchWorker(store, lane, settings, worker, batch_adapters, metrics=metrics)
        return cls(
            settings, worker, store, lane, served, recorder, scheduler, batch_worker, coordinator, stop, until_idle
        )

    async def start_services(self, services: TaskGroup, handle_signals: bool) -> None:
        """The recorder, the lease heartbeat, the signal watch and the metrics reading."""
        await services.start(self.recorder.run)
        services.start_soon(self.keep_leases)
        if handle_signals:
            await services.start(self.watch_signals)
        if self.served is not None:
            # A lane of its own: the reading never waits behind, nor holds up, the recorder's commits.
            reads = DbLane(abandon_on_cancel=True)
            services.start_soon(
                self.served.metrics.keep_reading,
                functools.partial(reads.run_within, 0, self.store.ledger_counts),
                self.settings.metrics_interval,
            )

    async def work(self) -> None:
        """Claim, call and record, run batches and jobs, until stopped or (`until_idle`) done.
        After a stop, calls in flight and the batch step under way get the grace period;
        submitted batches stay with the provider and are picked up again at the next start."""
        async with anyio.create_task_group() as work:
            work.start_soon(self.run_batches)
            work.start_soon(self.run_jobs)
            await self.scheduler.run(work, until_idle=self.until_idle, stop=self.stop)
            self.coordinator.look_now()  # nothing left to claim: the coordinator need not wait for its poll
            if self.stop.is_set():
                with anyio.move_on_after(self.settings.shutdown_grace):
                    await first_done(self.scheduler.wait_all_done, self.no_grace.wait)
                    await first_done(self.batch_done.wait, self.no_grace.wait)
                work.cancel_scope.cancel()

    async def shut_down(self) -> ReleasedRows:
        """Write what is pending, stop the heartbeat, give back the slots of calls cut off and
        retire the worker; shielded, so a cancel cannot leave it half done."""
        with anyio.CancelScope(shield=True):
            await self.recorder.flush()
            self.renewing.cancel()  # no heartbeat may land after this worker retires
            await self.scheduler.leases.settled(timeout=5)
            released = await self.lane.run(self.store.release_worker, self.worker, self.settings.retry_max_attempts)
            await self.lane.run(self.store.retire_worker, self.worker)
            self.scheduler.announce_released(released, "gave back slots of calls cut off at stop")
            await self.scheduler.close_adapters()
        return released

    async def keep_leases(self) -> None:
        with self.renewing:
            await self.scheduler.leases.run()

    async def watch_signals(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            task_status.started()
            async for _ in received:
                if self.signalled:  # second signal: no more grace
                    self.no_grace.set()
                self.signalled = True
                self.stop.set()

    async def run_batches(self) -> None:
        try:
            progressed = self.coordinator.look_now
            await self.batch_worker.run(stop=self.stop, until_idle=self.until_idle, progressed=progressed)
        finally:
            self.batch_done.set()
            self.scheduler.look_now()

    async def run_jobs(self) -> None:
        await self.coordinator.run(stop=self.stop, until_idle=self.until_idle, stepped=self.scheduler.look_now)


def _database_failure(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The database's error if that is all the group holds (the daemon stops with one line)."""
    failed, other = group.split(DatabaseUnavailable)
    return None if failed is None or other is not None else _first_leaf(failed)


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
