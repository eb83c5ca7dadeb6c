"""Benchmark: slot utilisation. 300 requests, limit 5, provider latency 100 ms.

Makespan (first claim to last outcome, read from the event log) divided by the
ideal 300 / 5 x 0.1 s = 6 s. Target: at most 1.05. The mock provider runs in
its own process; the daemon runs the real path (OpenAI SDK over HTTP). Beside it,
in the same run: the same calls through the same SDK and server under a bare
semaphore (the floor HTTP and the SDK set), and the daemon over the in-process
mock adapter sleeping the same latency (the ledger's scheduling alone).

    python -m bench.slot_utilisation [--db sqlite|postgres] [--requests 300] [--limit 5] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import io
import json
import time
from typing import Any

import anyio
import openai

from adapters.base import Adapter
from adapters.mock import MockAdapter
from adapters.mock_provider import mock_provider_process
from bench.common import fresh_database, specs
from ledger.api import Ledger
from ledger.daemon import run_daemon
from ledger.events import configure_logging
from ledger.settings import load_settings


async def bare_sdk_loop(base: str, n: int, limit: int) -> float:
    """The same calls through the same SDK and server, bounded by a plain semaphore: no ledger."""
    client = openai.AsyncOpenAI(api_key="bench", base_url=base + "/v1", max_retries=0)
    semaphore = anyio.Semaphore(limit)

    async def one(i: int) -> None:
        async with semaphore:
            await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"Evaluate item {i}."}]
            )

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    await client.close()
    return time.perf_counter() - t0


def daemon_run(
    url: str, n: int, limit: int, provider: str, adapters: dict[str, Adapter] | None = None, **env: Any
) -> tuple[float, float]:
    """Enqueue `n` requests, run the daemon until idle: (makespan from the event log, whole run).

    The makespan is first `acquired` to last `released`: the time slots were in use,
    start-up excluded.
    """
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=url, MAX_CONCURRENT_LLM_CALLS=limit, **env)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(specs(n, provider=provider))
    log = io.StringIO()
    configure_logging("INFO", stream=log)
    t0 = time.perf_counter()
    anyio.run(lambda: run_daemon(settings, until_idle=True, adapters=adapters))
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    slots = [r["ts"] for r in records if r["event"] in ("acquired", "released")]
    return float(max(slots) - min(slots)), wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    ideal = args.requests / args.limit * args.latency
    with fresh_database(args.db) as url, mock_provider_process("--latency", str(args.latency)) as mock:
        base = mock.base_url
        makespan, wall = daemon_run(
            url, args.requests, args.limit, "openai", OPENAI_BASE_URL=base + "/v1", OPENAI_API_KEY="bench"
        )
        provider = mock.stats()
        bare = anyio.run(bare_sdk_loop, base, args.requests, args.limit)
    with fresh_database(args.db) as url:
        adapters: dict[str, Adapter] = {"mock": MockAdapter(latency=args.latency)}
        in_process, _ = daemon_run(url, args.requests, args.limit, "mock", adapters)
    print(f"db={args.db} requests={args.requests} limit={args.limit} latency={args.latency}s")
    print(
        f"makespan {makespan:.3f} s  ideal {ideal:.3f} s  ratio {makespan / ideal:.3f}  "
        f"(whole daemon run incl. start-up {wall:.3f} s; provider max in flight {provider['max_in_flight']})"
    )
    print(f"bare SDK + semaphore, same server: {bare:.3f} s  ratio {bare / ideal:.3f}")
    print(f"ledger, in-process mock adapter:   {in_process:.3f} s  ratio {in_process / ideal:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
