"""The daemon's SQLite commits leave the WAL to a thread of its store's (`store/checkpoints.py`):
what it commits reaches the database file without the committing connection (its database lane)
copying it, and the thread lives exactly as long as the store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ledger.store import Store
from ledger.store.checkpoints import THREAD_NAME, WAL_BACKSTOP_PAGES
from ledger.store.commit import transaction
from tests.integration.store_helpers import daemon_store

# ~2,300 pages of 4 KiB in one commit: past SQLite's default threshold (1,000), under the backstop.
_FILL = (
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 3000) "
    "INSERT INTO t_pages SELECT randomblob(3000) FROM r"
)


def _checkpoint_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == THREAD_NAME)


def test_a_daemons_commit_reaches_the_database_file_copied_by_the_thread_not_the_commit(
    sqlite_url: str, tmp_path: Path
) -> None:
    database = tmp_path / "ledger.db"
    with daemon_store(sqlite_url) as store:
        with transaction(store.engine, store.dialect) as conn:
            # The daemon's connections leave it past SQLite's default, up to the backstop.
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == WAL_BACKSTOP_PAGES
            conn.exec_driver_sql("CREATE TABLE t_pages (b BLOB)")
        before = database.stat().st_size
        with transaction(store.engine, store.dialect) as conn:
            conn.exec_driver_sql(_FILL)
        deadline = time.monotonic() + 30
        while database.stat().st_size < before + 8_000_000:
            assert time.monotonic() < deadline, "the committed pages never reached the database file"
            time.sleep(0.02)


def test_other_connections_keep_sqlites_own_checkpoints(sqlite_url: str) -> None:
    """An enqueue, the CLI, the web view: no thread, SQLite's default threshold."""
    before = _checkpoint_threads()
    store = Store(sqlite_url)
    try:
        with transaction(store.engine, store.dialect) as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000
        assert _checkpoint_threads() == before
    finally:
        store.close()


def test_the_thread_lives_as_long_as_the_daemons_store_and_not_on_postgresql(db_url: str) -> None:
    before = _checkpoint_threads()
    with daemon_store(db_url) as store:
        assert _checkpoint_threads() == before + (1 if store.dialect.name == "sqlite" else 0)
    assert _checkpoint_threads() == before


def test_closing_the_daemons_store_twice_is_harmless(sqlite_url: str) -> None:
    """The daemon closes its store on every way out; a second close finds nothing left to stop."""
    before = _checkpoint_threads()
    store = Store(sqlite_url, ping_on_checkout=False, background_checkpoints=True)
    store.close()
    store.close()
    assert _checkpoint_threads() == before
