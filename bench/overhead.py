"""Benchmark: ledger overhead, requests/s end to end against the in-process mock at zero latency.

Beside it, in the same run, a bare `asyncio.Semaphore` + `gather` loop over the
same adapter: the price of durability (claims, attempt rows, outcomes, leases).
Target: at least 1,000 requests/s on PostgreSQL.

    python -m bench.overhead [--requests 5000] [--limit 50]
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


def ledger_run(kind: str, n: int, limit: int) -> float:
    with fresh_database(kind) as url:
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=url,
            MAX_CONCURRENT_LLM_CALLS=limit,
            LEDGER_LOG_LEVEL="WARNING",
        )
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(specs(n, provider="mock"))
        t0 = time.perf_counter()
        anyio.run(lambda: run_daemon(settings, until_idle=True, adapters={"mock": MockAdapter()}))
        elapsed = time.perf_counter() - t0
        with Ledger(settings=settings) as ledger:
            assert ledger.store.status_counts()["completed"] == n
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--limit", type=int, default=50)
    args = parser.parse_args()
    configure_logging("WARNING")
    logging.getLogger("ledger").setLevel("WARNING")
    bare = asyncio.run(bare_loop(args.requests, args.limit))
    print(f"requests={args.requests} limit={args.limit}")
    print(f"bare semaphore+gather  {args.requests / bare:10.0f} req/s")
    for kind in ("sqlite", "postgres"):
        elapsed = ledger_run(kind, args.requests, args.limit)
        print(f"ledger on {kind:9s}    {args.requests / elapsed:10.0f} req/s  ({elapsed:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
