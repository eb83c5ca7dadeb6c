"""Where an enqueue keeps its validated rows until every one of them is checked.

A private scratch SQLite database (SQLite's empty file name: a temporary file,
deleted when closed, held in a small page cache and spilled to disk beyond it), so an
enqueue's memory stays flat however large its input, while it still finds a key
reused with a different body hundreds of thousands of lines apart. It is not the
ledger: nothing here is durable, and the ledger is not touched until the input has
been read to its end.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One validated request: where it came from, its key, body hash, job and row text."""

    pos: int  # line number, or index in a Python batch
    key: str
    body_hash: str
    job_id: str | None
    custom: bool  # the key is the caller's (custom_id), not the content hash
    row: str  # ledger.enqueue.row_text


_SCHEMA = """
CREATE TABLE staged (
    pos INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    body_hash TEXT NOT NULL,
    job_id TEXT,
    custom INTEGER NOT NULL,
    row TEXT NOT NULL,
    known INTEGER NOT NULL DEFAULT 0
)
"""
_COLUMNS = "pos, key, body_hash, job_id, custom, row"
# Bound parameters per lookup: below SQLite's oldest limit (999).
_PER_LOOKUP = 500


class Staging:
    """First occurrences of each key, in input order; repeats with the same body counted."""

    def __init__(self) -> None:
        self.db = sqlite3.connect("", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(_SCHEMA)
        self.db.execute("BEGIN")
        self.count = 0  # entries staged (first occurrences)
        self.repeats = 0  # entries whose key came earlier with the same body

    def close(self) -> None:
        self.db.close()

    def add(self, block: list[Entry]) -> tuple[Entry, Entry] | None:
        """Stage a block of entries; the first (entry, earlier entry) pair whose key is the same
        and whose body is not, or None. Repeats with the same body are counted, not staged."""
        earlier = self._by_key(list({e.key for e in block}))
        fresh: list[Entry] = []
        for entry in block:
            first = earlier.get(entry.key)
            if first is None:
                earlier[entry.key] = entry
                fresh.append(entry)
            elif first.body_hash != entry.body_hash:
                return entry, first
            else:
                self.repeats += 1
        self.db.executemany(
            f"INSERT INTO staged ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            [(e.pos, e.key, e.body_hash, e.job_id, int(e.custom), e.row) for e in fresh],
        )
        self.count += len(fresh)
        return None

    def job_ids(self) -> list[str | None]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT job_id FROM staged")]

    def pages(self, size: int, *, unknown_only: bool = False) -> Iterator[list[Entry]]:
        """Staged entries in input order, `size` at a time (only those not marked known)."""
        after = -1
        known = "AND known = 0" if unknown_only else ""
        while True:
            page = [
                _entry(r)
                for r in self.db.execute(
                    f"SELECT {_COLUMNS} FROM staged WHERE pos > ? {known} ORDER BY pos LIMIT ?", (after, size)
                )
            ]
            if not page:
                return
            yield page
            after = page[-1].pos

    def mark_known(self, positions: list[int]) -> None:
        """These are in the ledger already, with the same body: nothing to write for them."""
        self.db.executemany("UPDATE staged SET known = 1 WHERE pos = ?", [(p,) for p in positions])

    def _by_key(self, keys: list[str]) -> dict[str, Entry]:
        found: dict[str, Entry] = {}
        for i in range(0, len(keys), _PER_LOOKUP):
            part = keys[i : i + _PER_LOOKUP]
            marks = ", ".join("?" * len(part))
            # Without the row text: only where and with which body each key came first.
            sql = f"SELECT pos, key, body_hash, job_id, custom, '' FROM staged WHERE key IN ({marks})"
            for r in self.db.execute(sql, part):
                found[r[1]] = _entry(r)
        return found


def _entry(r: tuple[object, ...]) -> Entry:
    pos, key, body_hash, job_id, custom, row = r
    return Entry(
        int(str(pos)), str(key), str(body_hash), None if job_id is None else str(job_id), bool(custom), str(row)
    )
