"""Benchmark: several producers enqueueing at once on one PostgreSQL, and how long they wait on locks.

N `ledger enqueue` processes start together, each with a file of its own distinct lines
(`--lines` in all, split evenly), against one fresh ledger; then, as the baseline, one
process enqueues a file of the same number of lines alone into another fresh ledger. While
they run, `pg_stat_activity` is sampled every ~10 ms for the producers' backends (each has
its own `application_name`): a sample in which a backend waits on a lock (`wait_event_type`
= `Lock`: an advisory lock, a row, another transaction) counts the time since the sample
before as lock wait for it.

Reports the aggregate rows/s of the N producers (first start to last end) and of the one
alone, and each producer's estimated lock wait. Enqueues of different questions should not
wait for each other: the N together reach at least the rows/s of one alone, lock wait ~0.

    python -m bench.enqueue_producers [--producers 4] [--lines 100000] [--pg DSN]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg

from bench.common import PG_DSN, fresh_database
from bench.enqueue_100k import child_env, write_file
from ledger.store import Store

APP_PREFIX = "ledger-producer-"
SAMPLE_EVERY_S = 0.01


class LockSampler:
    """On a thread: which producers' backends wait on a lock, sampled until stopped."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.waits: Counter[str] = Counter()  # producer -> samples waiting on a lock
        self.waited: dict[str, float] = {}  # producer -> seconds of those samples (time since the one before)
        self.kinds: Counter[str] = Counter()  # wait_event (advisory, tuple, transactionid, ...) -> samples
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        query = (
            "SELECT application_name, wait_event FROM pg_stat_activity"
            " WHERE application_name LIKE %s AND wait_event_type = 'Lock'"
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            before = time.perf_counter()
            while not self._stop.is_set():
                rows = conn.execute(query, (APP_PREFIX + "%",)).fetchall()
                now = time.perf_counter()
                for name, event in rows:
                    self.waits[name] += 1
                    self.waited[name] = self.waited.get(name, 0.0) + (now - before)
                    self.kinds[event] += 1
                before = now
                self.samples += 1
                time.sleep(SAMPLE_EVERY_S)


def enqueue_together(url: str, files: list[Path]) -> float:
    """Start one `ledger enqueue` per file at once; seconds from the first start to the last end.
    The ledger's tables are made first: the producers do not queue behind its migration."""
    Store(url).close()
    started = time.perf_counter()
    children = []
    for i, path in enumerate(files):
        env = {**child_env(url), "PGAPPNAME": f"{APP_PREFIX}{i}"}
        command = [sys.executable, "-m", "ledger.cli", "enqueue", str(path), "--provider", "mock"]
        children.append(subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for child in children:
        _, err = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"ledger enqueue exited {child.returncode}: {err.decode()[-500:]}")
    return time.perf_counter() - started


def split_files(tmp: Path, lines: int, producers: int) -> list[Path]:
    """`producers` files of distinct lines (`lines` in all): keys and questions differ across files."""
    each = lines // producers
    whole = tmp / "all.jsonl"
    write_file(whole, each * producers)
    files = [tmp / f"part-{i}.jsonl" for i in range(producers)]
    with whole.open() as source:
        for path in files:
            with path.open("w") as part:
                for _ in range(each):
                    part.write(source.readline())
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--pg", default=PG_DSN)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = split_files(Path(tmp), args.lines, args.producers)
        total = sum(1 for path in files for _ in path.open())
        with fresh_database("postgres", args.pg) as url, LockSampler(args.pg) as sampler:
            together = enqueue_together(url, files)
        with fresh_database("postgres", args.pg) as url:
            alone = enqueue_together(url, [Path(tmp) / "all.jsonl"])
    print(f"{args.producers} producers, {total} distinct lines in all, {os.cpu_count()} cores")
    print(f"  together: {total / together:9.0f} rows/s  {together:6.2f} s")
    print(f"  one alone: {total / alone:8.0f} rows/s  {alone:6.2f} s")
    for i in range(args.producers):
        waited = sampler.waited.get(f"{APP_PREFIX}{i}", 0.0)
        print(f"  producer {i}: ~{waited:.2f} s waiting on a lock ({sampler.waits[f'{APP_PREFIX}{i}']} samples)")
    kinds = ", ".join(f"{k}: {n}" for k, n in sampler.kinds.most_common()) or "none"
    print(f"  lock waits seen ({sampler.samples} samples): {kinds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
