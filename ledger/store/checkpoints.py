"""SQLite: the daemon's write-ahead log copied back into the database file by a thread of its
own, not inside the commits of its database lane.

By default SQLite has the connection whose commit leaves the WAL past 1,000 pages copy the WAL
into the database file and sync both, inside that commit (`wal_autocheckpoint`). In the daemon
that connection is its database lane, which every claim, outcome and mapped result chunk waits
on: mapping a provider batch's 100,000 results, a quarter of the lane's time went to those
copies (`bench.batch_100k`: 16,800-18,600 requests/s mapped with them, 20,700-21,600 without,
one sitting). A PASSIVE checkpoint waits for no reader or writer and runs in SQLite's C code
without the GIL: in a thread of its own it runs on the other core, after each commit.

The daemon's connections keep a backstop (`WAL_BACKSTOP_PAGES`): should the thread fall behind
(a starved machine, a failing disk), the committing connection checkpoints as SQLite's default
would, so the WAL stays bounded. Other processes (an enqueue, the CLI, the web view) keep
SQLite's default. PostgreSQL has a checkpointer process of its own: nothing to do there.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

LOG = logging.getLogger("ledger.store")

# The WAL's pages at which a commit of the daemon's checkpoints itself: ~40 MB of 4 KiB pages.
WAL_BACKSTOP_PAGES = 10_000
# Least time between two checkpoints, however often the daemon commits (a group commit every few
# milliseconds under load). While the WAL fills fast (a provider batch's results: thousands of
# pages a commit) the next follows at once; while it fills slowly (online calls: a few pages a
# commit) a checkpoint a second copies what came, as SQLite's default would at its 1,000 pages,
# not a few pages and two syncs of the disk twenty times a second.
BUSY_PAUSE_SECONDS = 0.05
CALM_PAUSE_SECONDS = 1.0
BUSY_PAGES = 1000
THREAD_NAME = "ledger-wal-checkpoints"


class WalCheckpoints:
    """A PASSIVE checkpoint after the engine's commits, in a thread of its own, until `stop`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._due = threading.Event()
        self._stopping = threading.Event()
        event.listen(engine, "commit", self._committed)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _committed(self, _conn: Any) -> None:
        self._due.set()

    def _run(self) -> None:
        try:
            raw = self._engine.raw_connection()
        except Exception as exc:  # the backstop checkpoints instead; say so
            LOG.warning("no background WAL checkpoints: %s", exc)
            return
        driver: Any = raw.driver_connection  # autocommit (`configure_engine`): outside any transaction
        try:
            while True:
                self._due.wait()
                if self._stopping.is_set():
                    return
                self._due.clear()
                pages = 0
                try:  # (busy, pages in the WAL, pages copied back)
                    _, pages, _ = driver.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # the backstop checkpoints meanwhile; say so, go on
                    LOG.warning("background WAL checkpoint failed: %s", exc)
                if self._stopping.wait(BUSY_PAUSE_SECONDS if pages >= BUSY_PAGES else CALM_PAUSE_SECONDS):
                    return
        finally:
            raw.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the thread (a checkpoint under way is finished first: it is SQLite's to stop)."""
        if self._stopping.is_set():
            return
        event.remove(self._engine, "commit", self._committed)
        self._stopping.set()
        self._due.set()
        self._thread.join(timeout)
