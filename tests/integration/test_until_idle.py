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
    """The mock's answers, noting the cyclic collector's settings as each call goes out."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[tuple[int, int, int], bool]] = set()

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        self.seen.add((gc.get_threshold(), gc.get_freeze_count() > 0))
        return await super().call(request, timeout=timeout)


@pytest.mark.parametrize("app_froze_its_own", [False, True])
def test_a_daemon_tunes_the_collector_while_it_runs_and_gives_the_process_back_its_own(
    sqlite_url: str, app_froze_its_own: bool
) -> None:
    """While it runs, the daemon keeps the collector off what existed before it started and
    collects the young generation less often (decision 79: 3-14 % of its instructions at zero
    latency). A program that runs a daemon in process gets its collector back as it was, and
    what it had frozen itself stays frozen."""
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=sqlite_url)
    store = Store(sqlite_url)
    _queue(store, 5)
    watcher, before = _CollectorWatcher(), gc.get_threshold()
    apps_own = [["a program's long-lived state"]]
    if app_froze_its_own:
        gc.freeze()
    try:
        anyio.run(lambda: run_daemon(settings, until_idle=True, handle_signals=False, adapters={"mock": watcher}))
        assert watcher.seen == {((YOUNG_COLLECTION_EVERY, *before[1:]), True)}
        assert gc.get_threshold() == before
        still_frozen = all(o is not apps_own for o in gc.get_objects())  # frozen: in no generation
        assert still_frozen if app_froze_its_own else gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
        store.close()
    assert store.status_counts()["completed"] == 5
