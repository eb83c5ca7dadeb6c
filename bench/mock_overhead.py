"""Benchmark: what the mock provider itself costs, so the other benchmarks can be trusted.

The brief asks for the mock's own overhead to sit far below the latency it
simulates. This measures, against a mock at zero latency in its own process,
the round-trip time of one chat completion at a time:
- with a bare `httpx` client (the server: parse, answer, write);
- through the real `openai` SDK (what every ledger call also pays client-side);
and then, with the mock at `--latency`, how far above that latency a call lands.

    python -m bench.mock_overhead [--calls 500] [--latency 0.1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
import httpx
import openai

from adapters.mock_provider import mock_provider_process

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Evaluate item 1."}]}


async def timed(calls: int, one: Callable[[int], Awaitable[object]]) -> list[float]:
    await one(-1)  # connect and warm up outside the measurement
    samples = []
    for i in range(calls):
        t0 = time.perf_counter()
        await one(i)
        samples.append(time.perf_counter() - t0)
    return samples


async def raw_httpx(base: str, calls: int) -> list[float]:
    async with httpx.AsyncClient(base_url=base) as client:

        async def one(i: int) -> object:
            body = {**BODY, "messages": [{"role": "user", "content": f"Evaluate item {i}."}]}
            return (await client.post("/v1/chat/completions", json=body)).raise_for_status()

        return await timed(calls, one)


async def through_sdk(base: str, calls: int) -> list[float]:
    client = openai.AsyncOpenAI(api_key="bench", base_url=base + "/v1", max_retries=0)

    async def one(i: int) -> object:
        return await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": f"Evaluate item {i}."}]
        )

    try:
        return await timed(calls, one)
    finally:
        await client.close()


def report(label: str, samples: list[float], minus: float = 0.0) -> None:
    ms = sorted((s - minus) * 1000 for s in samples)
    p99 = ms[int(len(ms) * 0.99) - 1]
    print(f"{label:44} median {statistics.median(ms):6.2f} ms   p99 {p99:6.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--latency", type=float, default=0.1)
    args = parser.parse_args()
    with mock_provider_process("--latency", "0") as mock:
        base = mock.base_url
        report("mock at 0 latency, bare httpx", anyio.run(raw_httpx, base, args.calls))
        report("mock at 0 latency, openai SDK", anyio.run(through_sdk, base, args.calls))
    with mock_provider_process("--latency", str(args.latency)) as mock:
        base = mock.base_url
        samples = anyio.run(through_sdk, base, max(args.calls // 5, 20))
        report(f"mock at {args.latency}s, openai SDK, above the latency", samples, minus=args.latency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
