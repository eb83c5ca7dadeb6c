"""Benchmark: `ledger enqueue` of a 100k-line JSONL file, rows/s and peak memory.

Runs the real CLI in a child process (so peak RSS is the enqueue's alone) on
SQLite and on PostgreSQL: the file into an empty ledger; then, every request answered
meanwhile, as many other questions (plain rows into a ledger of that size), and the first
file's questions under other keys, each a response cache hit; on PostgreSQL also the same
file again, every line already there. Usage:

    python -m bench.enqueue_100k [--lines 100000] [--pg URL]

--pg defaults to $LEDGER_TEST_POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from bench.common import PG_DSN, fresh_database


def write_file(path: Path, lines: int, prefix: str = "bench", verb: str = "Grade") -> None:
    """`lines` distinct questions, keyed `{prefix}-{i}`: another prefix asks the same questions,
    another `verb` other questions."""
    with path.open("w") as f:
        for i in range(lines):
            f.write(
                json.dumps(
                    {
                        "custom_id": f"{prefix}-{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {
                            "model": "gpt-4o-mini",
                            "max_tokens": 256,
                            "messages": [
                                {
                                    "role": "system",
                                    "content": "You are a strict grader. Reason, then end with VERDICT: n.",
                                },
                                {
                                    "role": "user",
                                    "content": f"{verb} essay number {i} on clarity. " + "lorem ipsum " * 20,
                                },
                            ],
                        },
                    }
                )
                + "\n"
            )


def child_env(url: str) -> dict[str, str]:
    """A clean environment for a `ledger` child: only the database, quiet logs, and the caller's
    PYTHONPATH (so a benchmark of another tree, `PYTHONPATH=/that/tree`, runs that tree)."""
    env = {"LEDGER_DATABASE_URL": url, "PATH": "/usr/bin:/bin", "LEDGER_LOG_LEVEL": "WARNING"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def run(url: str, path: Path) -> tuple[float, float]:
    """Returns (seconds, peak RSS in MiB) of one `ledger enqueue` child process."""
    t0 = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "ledger.cli", "enqueue", str(path), "--provider", "mock"],
        env=child_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS, not the max of all children
    elapsed = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"ledger enqueue exited {child.returncode}")
    return elapsed, usage.ru_maxrss / 1024


def answer_everything(url: str) -> None:
    """Every request completed with an answer, as if a daemon had called them all: each is now a
    source the response cache answers the same question from."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE llm_requests SET status = 'completed', raw_output = 'VERDICT: 3', output_tokens = 3,"
                " input_tokens = 90, completed_at = CURRENT_TIMESTAMP"
            )
        )
    engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--pg", default=PG_DSN)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "requests.jsonl"
        write_file(path, args.lines)
        size_mb = path.stat().st_size / 2**20
        print(f"input: {args.lines} lines, {size_mb:.1f} MiB")
        results = {}
        if args.lines > 1000:  # the baseline: same process, a file 100x smaller
            small = Path(tmp) / "small.jsonl"
            write_file(small, args.lines // 100)
            small_s, small_peak = run(f"sqlite:///{tmp}/small.db", small)
            print(f"baseline sqlite, {args.lines // 100} lines: {small_s:.2f} s, peak RSS {small_peak:.1f} MiB")
        hits = Path(tmp) / "hits.jsonl"  # the same questions under other keys: every one a cache hit
        write_file(hits, args.lines, prefix="again")
        # Other questions, enqueued into the answered ledger just before the hits: plain rows
        # written into a ledger as large as the one the hits are (a little smaller, in fact).
        others = Path(tmp) / "others.jsonl"
        write_file(others, args.lines, prefix="other", verb="Rate")
        sqlite_url = f"sqlite:///{tmp}/bench.db"
        results["sqlite"] = run(sqlite_url, path)
        answer_everything(sqlite_url)
        results["sqlite, other questions"] = run(sqlite_url, others)
        results["sqlite, all cache hits"] = run(sqlite_url, hits)
        with fresh_database("postgres", args.pg) as pg_url:
            results["postgres"] = run(pg_url, path)
            again = run(pg_url, path)  # idempotent re-enqueue: every line is a duplicate
            answer_everything(pg_url)
            results["postgres, other questions"] = run(pg_url, others)
            results["postgres, all cache hits"] = run(pg_url, hits)
    for name, (seconds, peak) in results.items():
        print(f"{name:26s} {args.lines / seconds:9.0f} rows/s  {seconds:6.2f} s  peak RSS <= {peak:6.1f} MiB")
    print(f"re-enqueue (postgres, all duplicates): {args.lines / again[0]:.0f} lines/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
