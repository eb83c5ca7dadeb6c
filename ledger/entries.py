"""Each request of an enqueue checked and made into the row it stages, on one core or several.

Checking is most of an enqueue's work (the line's JSON, the spec, the provider's own check,
the canonical JSON, the hashes) and each request's is independent of every other's, so a
large file is checked on several cores: the file is read here, in blocks of lines, and the
blocks are checked by worker processes forked from this one (they start with everything
already imported, and are handed only the lines' bytes). What comes back is taken in the
file's order, so the first bad line is the one named, exactly as when checked here, and
nothing is written before every line has come back checked (`ledger.intake`).

Workers are forked, never spawned: a spawned worker would import the ledger again (a second
or more each), more than checking a file of a few thousand lines costs. Where fork does not
exist, or `LEDGER_ENQUEUE_WORKERS` is 1, or the file is small, lines are checked here.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any

from ledger.deadlines import deadline_text
from ledger.enqueue import Defaults, EnqueueError, RequestSpec, as_spec, checked_row, raw_lines, spec_of_raw
from ledger.prices import PriceTable
from ledger.stop_points import stop_point
from ledger.store.staging import Entry

# Lines per block a worker checks at a time: large enough that handing a block over costs
# little beside checking it, small enough that the blocks in flight hold little memory.
LINES_PER_BLOCK = 1000
# Blocks handed to the workers and not yet taken back, per worker: each always has the next.
_AHEAD_PER_WORKER = 2
# Parameters left out of requests: (provider, parameter) -> how many requests.
Dropped = Counter[tuple[str, str]]


@dataclass(frozen=True)
class EntryMaker:
    """What checking a request needs to know of the settings, and nothing that cannot be
    handed to a worker process."""

    columns: tuple[str, ...]
    compatible_base_url: str | None
    prices: PriceTable | None
    max_line_bytes: int
    pools_per_model: bool
    dialect_name: str

    def make(self, pos: int, item: RequestSpec | Mapping[str, Any], dropped: Dropped) -> Entry:
        """The staged entry of one request (its values in `columns` order); `EnqueueError` for a
        bad one (its message not yet placed); counts the parameters it leaves out in `dropped`."""
        spec = as_spec(item)  # a Python caller's list may hold anything
        if spec.provider == "openai-compatible" and not self.compatible_base_url:
            # Known now, not only when a daemon claims it: every such request would end config_error.
            raise EnqueueError("provider 'openai-compatible' needs OPENAI_COMPATIBLE_BASE_URL, which is not set")
        row, texts = checked_row(
            spec, self.compatible_base_url, self.prices, self.max_line_bytes, pools_per_model=self.pools_per_model
        )
        if row["deadline"] is not None:
            row["deadline"] = deadline_text(row["deadline"], self.dialect_name)
        values = tuple(texts[c] if c in texts else row.get(c) for c in self.columns)
        if row["dropped_params"]:
            dropped.update((row["provider"], name) for name in row["dropped_params"])
        custom = spec.idempotency_key is not None
        return Entry(pos, row["idempotency_key"], row["body_hash"], row["job_id"], custom, values)


@dataclass(frozen=True)
class FileLines:
    """A file's lines to check: where they come from, as messages name it, and the flags over them."""

    path: Path
    source: str  # `requests.jsonl`, or `<stdin>`
    defaults: Defaults


def check_block(maker: EntryMaker, lines: FileLines, block: list[tuple[int, bytes]]) -> tuple[list[Entry], Dropped]:
    """One block of a file's lines checked: their entries (blank lines have none) and the
    parameters left out; `EnqueueError` naming `FILE:LINE` of the first bad one."""
    entries: list[Entry] = []
    dropped: Dropped = Counter()
    if block[0][0] > LINES_PER_BLOCK:  # not the first block: a crash test may kill a worker here
        stop_point("checking_lines")
    for number, raw in block:
        try:
            spec = spec_of_raw(number, raw, lines.defaults, maker.max_line_bytes)
            if spec is not None:
                entries.append(maker.make(number, spec, dropped))
        except EnqueueError as exc:
            raise EnqueueError(f"{lines.source}:{number}: {exc}") from None
    return entries, dropped


def checked_blocks(maker: EntryMaker, lines: FileLines, workers: int) -> Iterator[tuple[list[Entry], Dropped]]:
    """The file's blocks checked, in the file's order: on `workers` forked processes once the
    file is longer than a block (and fork exists), else here."""
    with closing(raw_lines(lines.path, maker.max_line_bytes)) as raw:
        blocks = _in_blocks(raw)
        read = list(islice(blocks, 2))
        if len(read) < 2 or workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
            for block in chain(read, blocks):
                yield check_block(maker, lines, block)
            return
        yield from _on_workers(maker, lines, workers, chain(read, blocks))


def _on_workers(
    maker: EntryMaker, lines: FileLines, workers: int, blocks: Iterable[list[tuple[int, bytes]]]
) -> Iterator[tuple[list[Entry], Dropped]]:
    """Blocks handed to a pool of forked workers, at most a few ahead of the one taken back. A
    worker that dies (killed, out of memory) ends the enqueue with one line, nothing written."""
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_quiet_worker) as pool:
        pending: deque[Future[tuple[list[Entry], Dropped]]] = deque()
        try:
            for block in blocks:
                pending.append(pool.submit(check_block, maker, lines, block))
                if len(pending) >= workers * _AHEAD_PER_WORKER:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise EnqueueError(
                f"{lines.source}: a process checking its lines stopped unexpectedly; nothing was written"
            ) from None
        finally:
            for future in pending:
                future.cancel()


def _quiet_worker() -> None:
    """A worker leaves the parent's signals to the parent: Ctrl-C stops the enqueue once."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _in_blocks(raw: Iterator[tuple[int, bytes]]) -> Iterator[list[tuple[int, bytes]]]:
    block: list[tuple[int, bytes]] = []
    for item in raw:
        block.append(item)
        if len(block) >= LINES_PER_BLOCK:
            yield block
            block = []
    if block:
        yield block
