"""Benchmark: rate-limited goodput. Provider caps concurrency at 8; the daemon is configured for 16.

Completion time and 429 count of the ledger beside a naive unbounded `gather`
over the OpenAI SDK (its default 2 retries on) in the same run, same server.

    python -m bench.rate_limited [--requests 200] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import anyio
import openai

from adapters.mock_provider import mock_provider_process
from bench.common import fresh_database, specs
from ledger.api import Ledger
from ledger.daemon import run_daemon
from ledger.events import configure_logging
from ledger.settings import load_settings


async def naive(base: str, n: int) -> tuple[float, int]:
    client = openai.AsyncOpenAI(
        api_key="bench",
        base_url=base + "/v1",
    )

    async def one(i: int) -> bool:
        try:
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"Evaluate item {i}."}]
            )
            return True
        except openai.APIError:
            return False

    t0 = time.perf_counter()
    ok = await asyncio.gather(*(one(i) for i in range(n)))
    await client.close()
    return time.perf_counter() - t0, n - sum(ok)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    cap = ["--latency", str(args.latency), "--max-concurrency", "8"]
    with mock_provider_process(*cap) as mock:
        base = mock.base_url
        naive_s, naive_failed = asyncio.run(naive(base, args.requests))
        naive_stats = mock.stats()
    with fresh_database("sqlite") as url, mock_provider_process(*cap) as mock:
        base = mock.base_url
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=url,
            MAX_CONCURRENT_LLM_CALLS=16,
            OPENAI_BASE_URL=base + "/v1",
            OPENAI_API_KEY="bench",
            RETRY_MAX_ATTEMPTS=10,
            RETRY_INITIAL_DELAY=0.2,
            RETRY_MAX_DELAY=5,
        )
        configure_logging("ERROR")
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(specs(args.requests))
            t0 = time.perf_counter()
            anyio.run(lambda: run_daemon(settings, until_idle=True))
            ledger_s = time.perf_counter() - t0
            counts = ledger.store.status_counts()
        ledger_stats = mock.stats()
    print(
        f"requests={args.requests} provider max-concurrency=8 latency={args.latency}s ideal "
        f"{args.requests / 8 * args.latency:.2f} s"
    )
    print(
        f"naive gather (SDK retries on): {naive_s:6.2f} s  429s {naive_stats['status_counts'].get('429', 0):5}  "
        f"failed {naive_failed}"
    )
    print(
        f"ledger, limit 16:              {ledger_s:6.2f} s  429s {ledger_stats['status_counts'].get('429', 0):5}  "
        f"failed {counts['error']}  completed {counts['completed']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
