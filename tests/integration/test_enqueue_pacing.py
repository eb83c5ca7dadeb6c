"""An enqueue on SQLite pauses after each chunk only while a daemon may be waiting for the file's
write lock (`ledger.intake`): loading a file before any daemon runs is not slowed for nobody."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from ledger.enqueue import RequestSpec, build_spec
from ledger.intake import BATCH, Intake
from ledger.models import LlmWorker
from ledger.settings import load_settings
from ledger.store import Store
from ledger.store.dialect import ALONE_CHUNK_ROWS, db_now_plus

workers = LlmWorker.__table__  # type: ignore[attr-defined]
# Three chunks on SQLite while a daemon runs (1,000 rows each, `Dialect.enqueue_pacing`).
ROWS = 2_500


def specs(n: int) -> list[RequestSpec]:
    return [
        build_spec(provider="mock", model="m", idempotency_key=f"r-{i}", messages=[{"role": "user", "content": f"{i}"}])
        for i in range(n)
    ]


def enqueue(store: Store, url: str, n: int = ROWS) -> list[float]:
    """Enqueue `n` requests through the real intake; the pauses it took, in seconds."""
    pauses: list[float] = []
    result = Intake(store, load_settings(_env_file=None, LEDGER_DATABASE_URL=url), BATCH, pause=pauses.append).run(
        enumerate(specs(n))
    )
    assert result.inserted == n
    return pauses


def heartbeat(store: Store, worker: str, seconds_ago: float = 0.0) -> None:
    """`worker` registered as a daemon does it, its last heartbeat `seconds_ago`."""
    store.renew_leases(worker, 30.0)
    if seconds_ago:
        back_then = update(workers).where(workers.c.worker_id == worker).values(heartbeat_at=db_now_plus(-seconds_ago))
        with store.engine.begin() as conn:
            conn.execute(back_then)


@pytest.fixture
def store(sqlite_url: str) -> Any:
    store = Store(sqlite_url)
    yield store
    store.close()


def test_no_daemon_registered_means_no_pause(store: Store, sqlite_url: str) -> None:
    assert enqueue(store, sqlite_url) == []


def test_a_running_daemon_gets_a_pause_after_every_chunk(store: Store, sqlite_url: str) -> None:
    heartbeat(store, "daemon-1")
    pauses = enqueue(store, sqlite_url)
    assert len(pauses) == 3 and all(p > 0 for p in pauses)


def test_a_daemon_between_heartbeats_still_gets_its_pauses(store: Store, sqlite_url: str) -> None:
    heartbeat(store, "daemon-1", seconds_ago=30 * 60)  # a long lease: its next heartbeat is due
    assert len(enqueue(store, sqlite_url)) == 3


def test_a_daemon_that_stopped_cleanly_is_not_waited_for(store: Store, sqlite_url: str) -> None:
    heartbeat(store, "daemon-1")
    store.retire_worker("daemon-1")
    assert enqueue(store, sqlite_url) == []


def test_a_daemon_killed_hours_ago_is_not_waited_for(store: Store, sqlite_url: str) -> None:
    heartbeat(store, "killed-daemon", seconds_ago=2 * 3600)
    assert enqueue(store, sqlite_url) == []


def test_a_daemon_that_starts_half_way_is_let_in_from_then_on(store: Store, sqlite_url: str) -> None:
    """Alone, the enqueue writes big chunks; a daemon that registers meanwhile gets small ones,
    each followed by a pause, from the next chunk on."""
    insert_chunk = store.insert_chunk
    sizes: list[int] = []

    def insert_then_maybe_start_a_daemon(rows: list[Any], *args: Any, **kwargs: Any) -> Any:
        written = insert_chunk(rows, *args, **kwargs)
        sizes.append(len(rows))
        if len(sizes) == 1:  # a daemon registers while the enqueue writes its first chunk
            heartbeat(store, "late-daemon")
        return written

    store.insert_chunk = insert_then_maybe_start_a_daemon  # type: ignore[method-assign]
    pauses = enqueue(store, sqlite_url, n=ALONE_CHUNK_ROWS + 2_500)
    assert sizes == [ALONE_CHUNK_ROWS, 1_000, 1_000, 500]
    assert len(pauses) == 4  # after each chunk from the one the daemon registered during


def test_postgresql_never_pauses_daemon_or_not(pg_url: str) -> None:
    store = Store(pg_url)
    try:
        heartbeat(store, "daemon-1")
        assert enqueue(store, pg_url, n=6_000) == []  # two chunks there (5,000 rows each)
    finally:
        store.close()
