"""`--until-idle` ends when the ledger says nothing is left, not at some later poll."""

from __future__ import annotations

import gc

import anyio
import pytest

from adapters.base import CallRequest, CallResult
from adapters.mock import MockAdapter
from ledger.daemon import YOUNG_COLLECTION_EVERY, run_daemon
from ledger.enqueue import build_spec, to_row
from ledger.settings import load_settings
from ledger.store import Store


def _queue(store: Store, n: int) -> None:
    store.enqueue(
        to_row(
            build_spec(
                provider="mock", model="m", idempotency_key=f"k{i}", messages=[{"role": "user", "content": "hi"}]
            )
        )
        for i in range(n)
    )


def test_an_idle_daemon_ends_without_waiting_for_a_poll(sqlite_url: str) -> None:
    # Polls an hour apart: every wait of the run must end on an event, or the deadline fails it.
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=sqlite_url, LEDGER_POLL_INTERVAL=3600)
    store = Store(sqlite_url)
    _queue(store, 20)

    async def run() -> None:
        with anyio.fail_after(60):
            await run_daemon(settings, until_idle=True, handle_signals=False, adapters={"mock": MockAdapter()})

    anyio.run(run)
    assert store.status_counts()["completed"] == 20
    store.close()


class _CollectorWatcher(MockAdapter):
    """The mock's answers (after `latency`), noting the cyclic collector's settings as each call goes out."""

    def __init__(self, latency: float = 0.0) -> None:
        super().__init__(latency)
        self.seen: set[tuple[tuple[int, int, int], bool]] = set()
        self.frozen = 0

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        self.seen.add((gc.get_threshold(), gc.get_freeze_count() > 0))
        self.frozen = gc.get_freeze_count()
        return await super().call(request, timeout=timeout)


@pytest.mark.parametrize("how", ["finished", "the program had frozen its own objects", "cut off from outside"])
def test_a_daemon_tunes_the_collector_while_it_runs_and_gives_the_process_back_its_own(
    sqlite_url: str, how: str
) -> None:
    """While it runs, the daemon keeps the collector off what existed before it started and
    collects the young generation less often (decision 79: 3-14 % of its instructions at zero
    latency). A program that runs a daemon in process gets its collector back as it was, however
    the daemon ends, and what it had frozen itself stays frozen."""
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=sqlite_url, LEDGER_SHUTDOWN_GRACE=0)
    store = Store(sqlite_url)
    _queue(store, 5)
    cut_off = how == "cut off from outside"
    watcher, before = _CollectorWatcher(latency=3600 if cut_off else 0), gc.get_threshold()
    apps_own = [["a program's long-lived state"]]
    app_froze = how == "the program had frozen its own objects"
    if app_froze:
        gc.freeze()

    async def run() -> None:
        with anyio.move_on_after(1 if cut_off else 60):
            await run_daemon(settings, until_idle=True, handle_signals=False, adapters={"mock": watcher})

    tracked_at_start = len(gc.get_objects())
    try:
        anyio.run(run)
        assert watcher.seen == {((YOUNG_COLLECTION_EVERY, *before[1:]), True)}
        if not app_froze:  # what the daemon built to keep (its engine, its statements) is frozen too
            assert watcher.frozen > tracked_at_start + 1000  # some 2,300 objects; 36 without
        assert gc.get_threshold() == before
        still_frozen = all(o is not apps_own for o in gc.get_objects())  # frozen: in no generation
        assert still_frozen if app_froze else gc.get_freeze_count() == 0
    finally:
        if app_froze:
            gc.unfreeze()
        store.close()
    assert store.status_counts().get("completed", 0) == (0 if cut_off else 5)
