"""An enqueue from start to end: read and check everything, then write in short transactions.

1. Every request is validated and staged (`store.staging`): a bad line, or a key
   reused with a different body anywhere in the input, stops the enqueue before
   the ledger is touched.
2. An input larger than one transaction is checked against the ledger, key by key:
   a key already there with a different body stops it too, still with nothing
   written. Keys already there with the same body are repeats: nothing to write.
3. The rest goes in with one set-based statement per chunk, each chunk its own
   short transaction (`Dialect.enqueue_pacing`): on SQLite a running daemon waits
   for the file's one write lock at most one chunk, never a whole file, and a pause
   after each chunk lets it in. The pause is for a daemon: with none heard from lately
   (`DAEMON_HEARD_WITHIN_S`), no daemon's calls wait for the lock, and the chunks are larger
   (`ALONE_CHUNK_ROWS`) and follow one another at once. The enqueue is idempotent as a whole: run again after a crash
   half-way, it adds only what is missing.

A key taken with another body by a concurrent enqueue between steps 2 and 3 is found
in the chunk's own transaction, which rolls back; chunks already committed stay (the
message says how many requests that is), and running the enqueue again, once the
input is fixed, skips them.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger import events
from ledger.enqueue import STDIN, Defaults, EnqueueError, RequestSpec
from ledger.entries import Dropped, EntryMaker, FileLines, checked_blocks
from ledger.fingerprint import JSON_FIELDS, differing_fields
from ledger.settings import Settings
from ledger.store import EnqueueResult, Store
from ledger.store.intake import CHUNK_ROW_COLUMNS, KEYS_PER_LOOKUP, KeyConflict
from ledger.store.queue import KEEP_INSERTED_MAX
from ledger.store.staging import Entry, Staging

# Entries validated between two looks into the staging database for repeated keys.
_BLOCK = 1000
# A daemon heard from this recently may be waiting for SQLite's write lock: the enqueue pauses
# after each chunk for it. A daemon heartbeats at least every ten minutes (`leases.HEARTBEAT_AT_MOST_S`,
# whatever its lease), so an hour misses none that runs; a killed daemon's registration stops
# counting an hour after its last heartbeat (one that stopped cleanly leaves the registry at once).
DAEMON_HEARD_WITHIN_S = 3600.0


@dataclass(frozen=True)
class Positions:
    """How messages name a place in the input: `requests.jsonl:7` and `line 3` for a file,
    `requests[7]` for a Python batch, nothing for a single request."""

    at: Callable[[int], str | None]
    ref: Callable[[int], str]
    key_name: str  # what the caller called the key: custom_id, idempotency_key


def file_positions(source: str) -> Positions:
    return Positions(lambda pos: f"{source}:{pos}", lambda pos: f"line {pos}", "custom_id")


BATCH = Positions(lambda pos: f"requests[{pos}]", lambda pos: f"requests[{pos}]", "idempotency_key")
SINGLE = Positions(lambda pos: None, lambda pos: f"requests[{pos}]", "idempotency_key")


def enqueue_file(store: Store, settings: Settings, path: Path, defaults: Defaults) -> EnqueueResult:
    """`ledger enqueue FILE`: the file's requests, all checked (on several cores when it is large:
    `ledger.entries`) before any is written."""
    source = "<stdin>" if path == STDIN else str(path)
    lines = FileLines(path, source, defaults)
    return Intake(store, settings, file_positions(source)).run_file(lines, settings.enqueue_workers)


def enqueue_specs(
    store: Store, settings: Settings, specs: Iterable[RequestSpec | Mapping[str, Any]], *, single: bool = False
) -> EnqueueResult:
    """The Python API's batch (or one request): the same checks, messages naming `requests[i]`."""
    return Intake(store, settings, SINGLE if single else BATCH).run(enumerate(specs))


class Intake:
    """One enqueue (see the module's docstring)."""

    # Rows per chunk and the share of time spent writing them: `_pace`, before each chunk.
    rows_per_chunk: int
    duty: float

    def __init__(
        self, store: Store, settings: Settings, positions: Positions, *, pause: Callable[[float], None] = time.sleep
    ) -> None:
        self.store = store
        self.settings = settings
        self.positions = positions
        self.prices = settings.prices
        self.pause = pause
        self.columns = CHUNK_ROW_COLUMNS[1:]  # fair_seq is numbered when written
        self.maker = EntryMaker(
            self.columns,
            settings.compatible_base_url,
            self.prices,
            settings.max_line_bytes,
            settings.compatible_pools_per_model,
            store.dialect.name,
        )
        self.dropped: Dropped = Counter()  # (provider, parameter) left out -> requests

    def run(self, specs: Iterable[tuple[int, RequestSpec | Mapping[str, Any]]]) -> EnqueueResult:
        """The requests of a Python batch (or one), checked here."""
        return self._run(lambda staging: self._stage(staging, specs))

    def run_file(self, lines: FileLines, workers: int) -> EnqueueResult:
        """A file's requests, checked by `workers` processes when it is large (`ledger.entries`)."""
        return self._run(lambda staging: self._stage_file(staging, lines, workers))

    def _run(self, stage: Callable[[Staging], None]) -> EnqueueResult:
        staging = Staging(self.columns)
        try:
            stage(staging)
            self._pace()
            known = self._check_ledger(staging) if staging.count > self.rows_per_chunk else 0
            return self._write(staging, staging.repeats + known)
        finally:
            staging.close()

    def _stage(self, staging: Staging, specs: Iterable[tuple[int, RequestSpec | Mapping[str, Any]]]) -> None:
        block: list[Entry] = []
        for pos, spec in specs:
            block.append(self._entry(pos, spec))
            if len(block) >= _BLOCK:
                self._add(staging, block)
                block = []
        self._add(staging, block)

    def _entry(self, pos: int, item: RequestSpec | Mapping[str, Any]) -> Entry:
        try:
            return self.maker.make(pos, item, self.dropped)
        except EnqueueError as exc:
            raise EnqueueError(self._at(pos, str(exc))) from None

    def _stage_file(self, staging: Staging, lines: FileLines, workers: int) -> None:
        for entries, dropped in checked_blocks(self.maker, lines, workers):
            self.dropped.update(dropped)
            self._add(staging, entries)

    def _add(self, staging: Staging, block: list[Entry]) -> None:
        self._check_sources(block)
        clash = staging.add(block)
        if clash is not None:
            entry, first = clash
            raise EnqueueError(
                self._at(
                    entry.pos,
                    f"{self._key(entry)} was already used with a different body ({self.positions.ref(first.pos)})",
                )
            )

    def _check_sources(self, block: list[Entry]) -> None:
        """Every source a request names is a request in the ledger (one look per block)."""
        at = self.columns.index("sources")
        named = [(e.pos, json.loads(e.values[at])) for e in block if e.values[at] not in (None, "null")]
        if not named:
            return
        missing = set(self.store.missing_requests(s for _, sources in named for s in sources))
        for pos, sources in named:
            gone = next((s for s in sources if s in missing), None)
            if gone is not None:
                raise EnqueueError(self._at(pos, f"sources: request {gone} is not in the ledger"))

    def _check_ledger(self, staging: Staging) -> int:
        """Step 2: keys the ledger holds with another body stop the enqueue; those it holds with
        the same body are marked, not written. Returns how many were marked."""
        marked = 0
        for page in staging.pages(KEYS_PER_LOOKUP, keys_only=True):
            known = self.store.known_keys([e.key for e in page])
            same = []
            for entry in page:
                found = known.get(entry.key)
                if found is None:
                    continue
                if found.body_hash != entry.body_hash:
                    whole = staging.entry_at(entry.pos)
                    raise EnqueueError(self._ledger_conflict(whole, found.request_id, written=0))
                same.append(entry.pos)
            staging.mark_known(same)
            marked += len(same)
        return marked

    def _write(self, staging: Staging, duplicates: int) -> EnqueueResult:
        """Step 3: chunk by chunk, each its own transaction."""
        seqs = self.store.next_fair_seqs(staging.job_ids())
        keep = staging.count <= KEEP_INSERTED_MAX  # report each new row (events), or counts only
        inserted: list[dict[str, Any]] = []
        added = cached = twins = 0
        for chunk in staging.pages(lambda: self.rows_per_chunk, unknown_only=True):
            rows = []
            for entry in chunk:
                rows.append((seqs[entry.job_id], *entry.values))
                seqs[entry.job_id] += 1
            jobs = {e.job_id for e in chunk if e.job_id is not None}
            started = time.monotonic()
            try:
                written = self.store.insert_chunk(
                    rows, {e.key: e.body_hash for e in chunk}, jobs, self.settings.cache_policy
                )
            except KeyConflict as exc:
                entry = next(e for e in chunk if e.key == exc.key)
                raise EnqueueError(self._ledger_conflict(entry, exc.request_id, written=added)) from None
            added += len(written.inserted)
            duplicates += written.repeats
            cached, twins = cached + len(written.cache.hits), twins + written.cache.twins
            for hit in written.cache.hits:
                events.cache_hit(hit.request_id, hit.cached_from)
            if keep:
                by_key, trace_at = {e.key: e for e in chunk}, self.columns.index("trace")
                for request_id, key in written.inserted:
                    inserted.append(
                        {"id": request_id, "idempotency_key": key, "trace": json.loads(by_key[key].values[trace_at])}
                    )
            took = time.monotonic() - started
            if self._pace() and self.duty < 1:  # let it in before the next chunk
                self.pause(took * (1 - self.duty) / self.duty)
        return EnqueueResult(
            added,
            duplicates,
            self.store.queue_depth(),
            inserted if keep else [],
            cached=cached,
            twins=twins,
            dropped=dict(self.dropped),
        )

    def _pace(self) -> bool:
        """The chunk size and duty for what comes next: small chunks and pauses while a daemon may
        wait for them, big chunks when none was heard from. Asked before the first chunk and
        after every one: a daemon started half-way through is let in from then on. Returns
        whether a daemon may wait."""
        waits = self.store.live_daemons(DAEMON_HEARD_WITHIN_S) > 0
        self.rows_per_chunk, self.duty = self.store.dialect.enqueue_pacing(waits)
        return waits

    def _ledger_conflict(self, entry: Entry, request_id: int, *, written: int) -> str:
        ours = self._row(entry)
        fields = differing_fields(ours, self.store.stored_body(request_id))
        what = f" ({', '.join(fields)} differ{'s' if len(fields) == 1 else ''})" if fields else ""
        message = f"{self._key(entry)} is already in the ledger (request {request_id}) with a different body{what}"
        if written:
            message += (
                f"; {written} request(s) before it were added by this enqueue"
                " (enqueuing the input again, once fixed, skips them)"
            )
        return self._at(entry.pos, message)

    def _row(self, entry: Entry) -> dict[str, Any]:
        """A staged row as a dict of values (JSON columns parsed)."""
        row = dict(zip(self.columns, entry.values, strict=True))
        return {c: json.loads(v) if c in JSON_FIELDS else v for c, v in row.items()}

    def _key(self, entry: Entry) -> str:
        if entry.custom:
            return f"{self.positions.key_name} {entry.key!r}"
        return f"this request (content key {entry.key})"

    def _at(self, pos: int, message: str) -> str:
        where = self.positions.at(pos)
        return message if where is None else f"{where}: {message}"
