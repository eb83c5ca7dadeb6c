"""Where an enqueue keeps its validated rows until every one of them is checked.

A private scratch SQLite database (SQLite's empty file name: a temporary file,
deleted when closed, held in a small page cache and spilled to disk beyond it), so an
enqueue's memory stays flat however large its input, while it still finds a key
reused with a different body hundreds of thousands of lines apart. It is not the
ledger: nothing here is durable, and the ledger is not touched until the input has
been read to its end. Rows are kept as the tuples the ledger's insert takes, so the
write phase does no JSON work at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    """One validated request: where it came from, and its row (`values`, in `columns` order)."""

    pos: int  # line number, or index in a Python batch
    key: str
    body_hash: str
    job_id: str | None
    custom: bool  # the key is the caller's (custom_id), not the content hash
    values: tuple[Any, ...]


# Bound parameters per lookup: below SQLite's oldest limit (999).
_PER_LOOKUP = 500
# An entry's fields without its row: enough to look keys up and compare bodies.
_KEY_FIELDS = "pos, key, body_hash, job_id, custom"


class Staging:
    """First occurrences of each key, in input order; repeats with the same body counted."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.db = sqlite3.connect("", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        row = ", ".join(f"c{i}" for i in range(len(columns)))
        self.db.execute(
            "CREATE TABLE staged (pos INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, body_hash TEXT NOT NULL,"
            f" job_id TEXT, custom INTEGER NOT NULL, known INTEGER NOT NULL DEFAULT 0, {row})"
        )
        self._fields = f"{_KEY_FIELDS}, {row}"
        marks = ", ".join("?" * (5 + len(columns)))
        self._insert = f"INSERT INTO staged ({self._fields}) VALUES ({marks}) ON CONFLICT (key) DO NOTHING"
        self.db.execute("BEGIN")
        self.count = 0  # entries staged (first occurrences)
        self.repeats = 0  # entries whose key came earlier with the same body

    def close(self) -> None:
        self.db.close()

    def add(self, block: list[Entry]) -> tuple[Entry, Entry] | None:
        """Stage a block of entries; the first (entry, earlier entry) pair whose key is the same
        and whose body is not, or None. Repeats with the same body are counted, not staged."""
        firsts: dict[str, Entry] = {}
        clash: tuple[Entry, Entry] | None = None
        for entry in block:
            first = firsts.setdefault(entry.key, entry)
            if first is entry:
                continue
            if first.body_hash != entry.body_hash:
                clash = clash or (entry, first)
            else:
                self.repeats += 1
        before = self.db.total_changes
        self.db.executemany(
            self._insert,
            [(e.pos, e.key, e.body_hash, e.job_id, int(e.custom), *e.values) for e in firsts.values()],
        )
        added = self.db.total_changes - before
        self.count += added
        if added < len(firsts):  # keys met in an earlier block: looked up only then (rare)
            self.repeats += len(firsts) - added
            earlier = self._by_key(list(firsts))
            for entry in block:  # in input order: the first bad entry is the one named
                first = earlier[entry.key]
                if first.pos < entry.pos and first.body_hash != entry.body_hash:
                    return entry, first
        return clash

    def job_ids(self) -> list[str | None]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT job_id FROM staged")]

    def pages(
        self, size: int | Callable[[], int], *, unknown_only: bool = False, keys_only: bool = False
    ) -> Iterator[list[Entry]]:
        """Staged entries in input order, `size` at a time (only those not marked known); a
        callable `size` is asked before each page (an enqueue's chunks follow its pacing).
        `keys_only`: without their rows (`values` empty), for a look at which keys exist."""
        after = -1
        known = "AND known = 0" if unknown_only else ""
        fields = _KEY_FIELDS if keys_only else self._fields
        sql = f"SELECT {fields} FROM staged WHERE pos > ? {known} ORDER BY pos LIMIT ?"
        while True:
            rows = size() if callable(size) else size
            page = [_entry(r) for r in self.db.execute(sql, (after, rows))]
            if not page:
                return
            yield page
            after = page[-1].pos

    def entry_at(self, pos: int) -> Entry:
        """The staged entry at `pos`, with its row."""
        return _entry(self.db.execute(f"SELECT {self._fields} FROM staged WHERE pos = ?", (pos,)).fetchone())

    def mark_known(self, positions: list[int]) -> None:
        """These are in the ledger already, with the same body: nothing to write for them."""
        self.db.executemany("UPDATE staged SET known = 1 WHERE pos = ?", [(p,) for p in positions])

    def _by_key(self, keys: list[str]) -> dict[str, Entry]:
        """Where and with which body each key came first (without the rows)."""
        found: dict[str, Entry] = {}
        for i in range(0, len(keys), _PER_LOOKUP):
            part = keys[i : i + _PER_LOOKUP]
            sql = f"SELECT {_KEY_FIELDS} FROM staged WHERE key IN ({', '.join('?' * len(part))})"
            for r in self.db.execute(sql, part):
                found[r[1]] = _entry(r)
        return found


def _entry(r: tuple[Any, ...]) -> Entry:
    return Entry(int(r[0]), str(r[1]), str(r[2]), r[3], bool(r[4]), tuple(r[5:]))
