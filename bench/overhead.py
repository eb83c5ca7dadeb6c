"""Benchmark: ledger overhead, requests/s end to end against the in-process mock at zero latency.

Beside it, in the same run, a bare `asyncio.Semaphore` + `gather` loop over the
same adapter: the price of durability (claims, attempt rows, outcomes, leases).
Each daemon run also prints the process's CPU time per request (event loop and
database lane together): on a noisy machine it moves less than the wall from one run
to the next. SQLite's own work is in it and PostgreSQL's is not (a server process), so
compare it across trees, not across the two databases. Targets: 10,000
requests/s on SQLite, 5,000 on PostgreSQL.

Each database gets two daemon runs of `--requests` each, one after the other on the same
database, as a pipeline's daemon runs day after day: the first on a fresh database, where
slow start opens the pool a few slots per group commit (once per pool and database, decision
53: at zero latency, 35-80 ms of the run), and the second with the pool's peak known, which
is every later run's case.

    python -m bench.overhead [--requests 5000] [--limit 50] [--runs 1] [--only sqlite|postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import anyio

from adapters.base import CallRequest
from adapters.mock import MockAdapter
from bench.common import fresh_database, specs
from ledger.api import Ledger
from ledger.daemon import run_daemon
from ledger.events import configure_logging
from ledger.settings import load_settings


async def bare_loop(n: int, limit: int) -> float:
    adapter, semaphore = MockAdapter(), asyncio.Semaphore(limit)

    async def one(i: int) -> None:
        async with semaphore:
            await adapter.call(
                CallRequest(model="m", messages=[{"role": "user", "content": f"Evaluate item {i}."}]),
                timeout=10,
            )

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0


def ledger_runs(kind: str, n: int, limit: int) -> list[tuple[float, float]]:
    """(wall seconds, process CPU seconds) of a daemon draining `n` requests, twice on one
    database: on a fresh one (slow start ramps the pool), then with the pool's peak known."""
    runs = []
    with fresh_database(kind) as url:
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=url,
            MAX_CONCURRENT_LLM_CALLS=limit,
            LEDGER_LOG_LEVEL="WARNING",
        )
        for run in range(2):
            with Ledger(settings=settings) as ledger:
                ledger.enqueue_many(specs(n, provider="mock", first=run * n))
            t0, c0 = time.perf_counter(), time.process_time()
            anyio.run(lambda: run_daemon(settings, until_idle=True, adapters={"mock": MockAdapter()}))
            runs.append((time.perf_counter() - t0, time.process_time() - c0))
            with Ledger(settings=settings) as ledger:
                assert ledger.store.status_counts()["completed"] == (run + 1) * n
    return runs


RUNS = ("fresh database: slow start", "pool known")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--runs", type=int, default=1, help="daemon runs per database, one after the other")
    parser.add_argument("--only", choices=["sqlite", "postgres"], help="one database only")
    args = parser.parse_args()
    configure_logging("WARNING")
    logging.getLogger("ledger").setLevel("WARNING")
    bare = asyncio.run(bare_loop(args.requests, args.limit))
    print(f"requests={args.requests} limit={args.limit}")
    print(f"bare semaphore+gather  {args.requests / bare:10.0f} req/s")
    for kind in [args.only] if args.only else ["sqlite", "postgres"]:
        for _ in range(args.runs):
            for (elapsed, cpu), run in zip(ledger_runs(kind, args.requests, args.limit), RUNS, strict=True):
                rate, per_request = args.requests / elapsed, cpu / args.requests * 1e6
                print(
                    f"ledger on {kind:9s}    {rate:10.0f} req/s  ({elapsed:.2f} s, "
                    f"CPU {per_request:.0f} us/request; {run})"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
