"""Benchmark: the daemon, as a process, beside a bare SDK loop driving the same mock server.

The yardstick for "close to the bare SDK's speed": 3,000 requests, limit
10, a mock provider at zero latency in its own process. In the same run:
- the bare loop: `AsyncOpenAI` + `asyncio.Semaphore(limit)` + `gather`, SDK retries off;
- `ledger daemon --until-idle` as a subprocess on a fresh SQLite file, then on a fresh
  PostgreSQL schema, after `ledger enqueue` of the same requests.

The daemon's rate is taken from the ledger's own clock, first attempt started to last
request completed, so process start-up and SDK imports (paid once per daemon, not per
request) are not counted; the process wall time is printed beside it. Runs alternate
(bare, sqlite, postgres, bare, ...) so a noisy neighbour hurts all three alike.

    python -m bench.sdk_ratio [--requests 3000] [--limit 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import openai
from sqlalchemy import create_engine, text

from adapters.mock_provider import mock_provider_process
from bench.common import fresh_database

LEDGER = [sys.executable, "-m", "ledger.cli"]


async def bare_loop(base_url: str, n: int, limit: int) -> float:
    client = openai.AsyncOpenAI(api_key="bench", base_url=base_url, max_retries=0)
    semaphore = asyncio.Semaphore(limit)

    async def one(i: int) -> None:
        async with semaphore:
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"Evaluate item {i}."}]
            )

    await one(-1)  # connect and warm up, as the daemon does before its first claim
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return elapsed


def write_requests(path: Path, n: int) -> None:
    with path.open("w") as out:
        for i in range(n):
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Evaluate item {i}."}]}
            out.write(json.dumps({"custom_id": f"bench-{i}", "body": body}) + "\n")


def _seconds(value: object) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


def daemon_run(kind: str, base_url: str, requests_file: Path, n: int, limit: int) -> tuple[float, float]:
    """(seconds from first attempt to last completion, process wall seconds)."""
    with fresh_database(kind) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "OPENAI_", "ANTHROPIC_"))}
        env.update(
            LEDGER_DATABASE_URL=url,
            OPENAI_BASE_URL=base_url,
            OPENAI_API_KEY="bench",
            MAX_CONCURRENT_LLM_CALLS=str(limit),
            LEDGER_LOG_LEVEL="WARNING",
        )
        subprocess.run([*LEDGER, "enqueue", str(requests_file)], env=env, check=True, capture_output=True)
        t0 = time.perf_counter()
        subprocess.run([*LEDGER, "daemon", "--until-idle"], env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        engine = create_engine(url)
        with engine.connect() as conn:
            done = conn.execute(text("SELECT count(*) FROM llm_requests WHERE status = 'completed'")).scalar_one()
            first = conn.execute(text("SELECT min(started_at) FROM llm_attempts")).scalar_one()
            last = conn.execute(text("SELECT max(completed_at) FROM llm_requests")).scalar_one()
        engine.dispose()
        if done != n:
            raise SystemExit(f"{kind}: only {done} of {n} requests completed")
        return _seconds(last) - _seconds(first), wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    rates: dict[str, list[float]] = {"bare": [], **{k: [] for k in kinds}}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp, mock_provider_process() as mock:
        base_url = mock.base_url + "/v1"
        requests_file = Path(tmp) / "requests.jsonl"
        write_requests(requests_file, args.requests)
        print(f"requests={args.requests} limit={args.limit} mock latency=0 runs={args.runs}")
        for run in range(1, args.runs + 1):
            bare = args.requests / asyncio.run(bare_loop(base_url, args.requests, args.limit))
            rates["bare"].append(bare)
            line = [f"run {run}: bare SDK {bare:7.0f} req/s"]
            for kind in kinds:
                busy, wall = daemon_run(kind, base_url, requests_file, args.requests, args.limit)
                rate = args.requests / busy
                rates[kind].append(rate)
                ratios[kind].append(rate / bare)
                line.append(f"{kind} {rate:7.0f} req/s (x{rate / bare:.2f}, process {wall:5.2f} s)")
            print("  ".join(line), flush=True)
    print("median: bare SDK {:.0f} req/s".format(statistics.median(rates["bare"])))
    for kind in kinds:
        rate, ratio = statistics.median(rates[kind]), statistics.median(ratios[kind])
        runs = ", ".join(f"{r:.2f}" for r in ratios[kind])
        print(f"median: {kind:8s} {rate:7.0f} req/s  ratio {ratio:.2f}  (runs {runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
