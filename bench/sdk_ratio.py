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

    python -m bench.sdk_ratio [--requests 3000] [--limit 10] [--runs 3] [--cpu]

`--cpu` adds, per daemon run, the CPU time a request cost (Linux: /proc): the daemon process
(start-up included), the mock provider, and the rest of the machine, which on an otherwise idle
machine is the database server's (SQLite has none: it runs inside the daemon).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
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
from bench.common import fresh_database, machine_busy_s, proc_cpu_s

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


class CpuSplit:
    """CPU a request cost over one daemon run (`begin` to `end`): the daemon's (this process's
    children), the mock's, the rest of the machine's."""

    def __init__(self, mock_pid: int) -> None:
        self.mock_pid = mock_pid
        self.start = self.used = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy, _ = machine_busy_s()
        return children.ru_utime + children.ru_stime, proc_cpu_s(self.mock_pid) or 0.0, busy

    def begin(self) -> None:
        self.start = self._now()

    def end(self) -> None:
        (daemon, mock, machine), (daemon0, mock0, machine0) = self._now(), self.start
        self.used = (daemon - daemon0, mock - mock0, machine - machine0)

    def per_request_us(self, n: int) -> str:
        daemon, mock, machine = self.used
        rest = machine - daemon - mock
        return f"cpu us/req: daemon {daemon * 1e6 / n:.0f}, mock {mock * 1e6 / n:.0f}, rest {rest * 1e6 / n:.0f}"


def daemon_run(
    kind: str, base_url: str, requests_file: Path, n: int, limit: int, cpu: CpuSplit | None = None
) -> tuple[float, float]:
    """(seconds from first attempt to last completion, process wall seconds). `cpu`: started
    here, just before the daemon (the enqueue before it is not counted)."""
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
        if cpu is not None:
            cpu.begin()
        t0 = time.perf_counter()
        subprocess.run([*LEDGER, "daemon", "--until-idle"], env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        if cpu is not None:
            cpu.end()
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
    parser.add_argument("--cpu", action="store_true", help="CPU a request cost: daemon, mock, the rest (Linux)")
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
                cpu = CpuSplit(mock.proc.pid) if args.cpu else None
                busy, wall = daemon_run(kind, base_url, requests_file, args.requests, args.limit, cpu)
                rate = args.requests / busy
                rates[kind].append(rate)
                ratios[kind].append(rate / bare)
                line.append(f"{kind} {rate:7.0f} req/s (x{rate / bare:.2f}, process {wall:5.2f} s)")
                if cpu is not None:
                    line.append(f"[{cpu.per_request_us(args.requests)}]")
            print("  ".join(line), flush=True)
    print("median: bare SDK {:.0f} req/s".format(statistics.median(rates["bare"])))
    for kind in kinds:
        rate, ratio = statistics.median(rates[kind]), statistics.median(ratios[kind])
        runs = ", ".join(f"{r:.2f}" for r in ratios[kind])
        print(f"median: {kind:8s} {rate:7.0f} req/s  ratio {ratio:.2f}  (runs {runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
