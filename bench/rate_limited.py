"""Benchmark: rate-limited goodput. Provider caps concurrency at 8; the daemon is configured for 16.

Runs, each against a fresh mock provider process and a fresh SQLite ledger:
- a naive unbounded `gather` over the OpenAI SDK (its default 2 retries on);
- the ledger at limit 16: it has to learn the provider's 8 (slow start, one-step learning);
- the ledger at limit 8 (`--reference`): the same work with the limit known in advance, the
  best this machine's hot path does, to tell the learning's cost from the per-round overhead;
- with `--reference` too, a bare SDK loop held to the provider's cap by an `asyncio.Semaphore(8)`
  (no ledger, the cap known): how close to the bound the SDK itself gets on this machine;
- the ledger with `LEDGER_POOL_RPM` below the provider's own requests-per-window cap (that
  provider has no concurrency cap, so any 429 would be the window's): no 429;
- with `--provider-tpm T`, the ledger at 16 against a provider that admits T tokens per window
  and says what is left in its token headers, with no `LEDGER_POOL_TPM` configured: what the
  headers alone hold back (decision 85);
- with `--proxy-like`, only this: the ledger (limit 10, retries and waits as configured by
  default) against a provider that behaves like LiteLLM's proxy in front of a model limited to
  `--proxy-rpm` requests per `--proxy-window` seconds: answers carry the limit and what is left
  without a reset, 429s no retry-after but `llm_provider-retry-after` (the window); the pools are
  keyed per model (`LEDGER_COMPATIBLE_POOLS=model`) and a second, unlimited model's requests run
  beside. Printed: completed, errors, 429s, and the wall against the window's bound (the last
  window's calls can start `ceil(n / rpm) - 1` windows after the first).

The capacity bound is requests / 8 x latency. Wall is measured two ways: end to end (the
daemon's start-up included: migrations, adapter import) and as the provider saw it (its
first call received to its last answer sent), which is what the bound compares with.

    python -m bench.rate_limited [--requests 300] [--latency 0.1] [--no-naive] [--reference]
                                 [--provider-tpm 2000]
    python -m bench.rate_limited --proxy-like [--requests 150] [--proxy-rpm 60] [--proxy-window 60]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from typing import Any

import anyio
import openai

from adapters.mock_provider import mock_provider_process
from adapters.mock_provider.answers import chat_answer
from bench.common import fresh_database, specs
from ledger.api import Ledger
from ledger.daemon import run_daemon
from ledger.events import configure_logging
from ledger.settings import load_settings

CAP = 8
POOL = "openai:gpt-4o-mini"


async def naive(base: str, n: int) -> tuple[float, int]:
    client = openai.AsyncOpenAI(api_key="bench", base_url=base + "/v1")

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


async def bare_at_cap(base: str, n: int) -> None:
    """The SDK alone, never over the cap: its client-side cost per round is the floor."""
    client = openai.AsyncOpenAI(api_key="bench", base_url=base + "/v1", max_retries=0)
    semaphore = asyncio.Semaphore(CAP)

    async def one(i: int) -> None:
        async with semaphore:
            await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"Evaluate item {i}."}]
            )

    await asyncio.gather(*(one(i) for i in range(n)))
    await client.close()


def ledger_run(n: int, mock_args: list[str], limit: int, **env: Any) -> dict[str, Any]:
    """One daemon run until idle: wall, the provider's busy span, its status counts, the ledger's."""
    with fresh_database("sqlite") as url, mock_provider_process(*mock_args) as mock:
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=url,
            MAX_CONCURRENT_LLM_CALLS=limit,
            OPENAI_BASE_URL=mock.base_url + "/v1",
            OPENAI_API_KEY="bench",
            RETRY_MAX_ATTEMPTS=10,
            RETRY_INITIAL_DELAY=0.2,
            RETRY_MAX_DELAY=5,
            **env,
        )
        configure_logging("ERROR")
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(specs(n))
            t0 = time.perf_counter()
            anyio.run(lambda: run_daemon(settings, until_idle=True))
            wall = time.perf_counter() - t0
            counts = ledger.store.status_counts()
            learned = ledger.store.pool_usage().get(POOL, {}).get("learned_limit")
        stats = mock.stats()
    return {"wall": wall, "busy": stats["busy_seconds"], "stats": stats, "counts": counts, "learned": learned}


def proxy_like(n: int, rpm: int, window: float, latency: float) -> int:
    """`n` requests to a model the proxy limits to `rpm` per `window`, `n // 5` to one it does not
    limit, everything else the ledger's defaults but the pool limit (10)."""
    mock_args = ["--latency", str(latency), "--rpm", str(rpm), "--rpm-window", str(window)]
    mock_args += ["--rpm-model", "limited", "--proxy-headers"]
    free = n // 5
    with fresh_database("sqlite") as url, mock_provider_process(*mock_args) as mock:
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=url,
            MAX_CONCURRENT_LLM_CALLS=10,
            OPENAI_COMPATIBLE_BASE_URL=mock.base_url + "/v1",
            LEDGER_COMPATIBLE_POOLS="model",
        )
        configure_logging("ERROR")
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(specs(n, "openai-compatible", "limited") + specs(free, "openai-compatible", "free", n))
            t0 = time.perf_counter()
            anyio.run(lambda: run_daemon(settings, until_idle=True))
            wall = time.perf_counter() - t0
            counted = ledger.store.ledger_counts().requests  # exact (the web view's counts stop at a cap)
        stats = mock.stats()
    by_model: dict[str, dict[str, int]] = {}
    for (pool, status), count in counted.items():
        by_model.setdefault(pool.rsplit("/", 1)[-1], {})[status] = count
    bound = (math.ceil(n / rpm) - 1) * window + latency
    refused = stats["status_counts"].get("429", 0)
    limited, unlimited = by_model.get("limited", {}), by_model.get("free", {})
    print(f"proxy-like provider: {rpm} requests per {window:g} s for model `limited`, none for `free`")
    print(
        f"limited: {n} requests  completed {limited.get('completed', 0)}  error {limited.get('error', 0)}  "
        f"429s {refused}  wall {wall:.1f} s  bound {bound:.1f} s = {wall / bound:.2f}x bound"
    )
    print(f"free: {free} requests  completed {unlimited.get('completed', 0)}  error {unlimited.get('error', 0)}")
    return 0


def line(label: str, run: dict[str, Any], bound: float) -> str:
    return (
        f"{label:34} wall {run['wall']:6.2f} s  provider busy {run['busy']:6.2f} s = {run['busy'] / bound:4.2f}x bound"
        f"  429s {run['stats']['status_counts'].get('429', 0):3}  completed {run['counts']['completed']}"
        f"  failed {run['counts']['error']}  learned {run['learned']}"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--no-naive", action="store_true", help="skip the naive gather run")
    parser.add_argument("--reference", action="store_true", help="also run the ledger at limit 8 (known cap)")
    parser.add_argument("--rpm", type=int, default=60, help="the ledger's LEDGER_POOL_RPM (per --window)")
    parser.add_argument("--provider-rpm", type=int, default=75, help="the provider's own cap (per --window)")
    parser.add_argument("--window", type=float, default=1.0, help="seconds the RPM caps count over (a short minute)")
    parser.add_argument("--provider-tpm", type=int, default=None, help="also a provider admitting this many tokens")
    parser.add_argument("--proxy-like", action="store_true", help="only the LiteLLM-proxy-like scenario")
    parser.add_argument("--proxy-rpm", type=int, default=60, help="its model's requests per --proxy-window")
    parser.add_argument("--proxy-window", type=float, default=60.0, help="seconds its limit counts over")
    args = parser.parse_args()
    n = args.requests
    if args.proxy_like:
        return proxy_like(n if n != 300 else 150, args.proxy_rpm, args.proxy_window, args.latency)
    cap = ["--latency", str(args.latency), "--max-concurrency", str(CAP)]
    bound = n / CAP * args.latency
    print(f"requests={n} provider max-concurrency={CAP} latency={args.latency}s capacity bound {bound:.2f} s")
    if not args.no_naive:
        with mock_provider_process(*cap) as mock:
            naive_s, naive_failed = asyncio.run(naive(mock.base_url, n))
            naive_stats = mock.stats()
        print(
            f"{'naive gather (SDK retries on):':34} wall {naive_s:6.2f} s  "
            f"429s {naive_stats['status_counts'].get('429', 0):5}  failed {naive_failed}"
        )
    print(line("ledger, limit 16:", ledger_run(n, cap, 16), bound))
    if args.reference:
        print(line("ledger, limit 8 (cap known):", ledger_run(n, cap, CAP), bound))
        with mock_provider_process(*cap) as mock:
            t0 = time.perf_counter()
            asyncio.run(bare_at_cap(mock.base_url, n))
            stats = mock.stats()
        busy = stats["busy_seconds"]
        print(
            f"{'bare SDK, semaphore 8 (cap known):':34} wall {time.perf_counter() - t0:6.2f} s  provider busy "
            f"{busy:6.2f} s = {busy / bound:.2f}x bound  429s {stats['status_counts'].get('429', 0):3}"
        )
    # No concurrency cap here: every 429 there could be would be the window's.
    rpm_args = ["--latency", str(args.latency), "--rpm", str(args.provider_rpm), "--rpm-window", str(args.window)]
    rated = ledger_run(
        n,
        rpm_args,
        16,
        LEDGER_POOL_RPM=f"{POOL}={args.rpm}",
        LEDGER_RATE_WINDOW_SECONDS=args.window,
        # A full window opens again as its oldest calls slide out; the claim loop finds that by
        # polling. The window is 60x shorter than a minute here, so the poll interval is too.
        LEDGER_POLL_INTERVAL=min(0.5, args.window / 20),
    )
    rpm_bound = (n / args.rpm - 1) * args.window + args.latency
    print(
        f"provider caps {args.provider_rpm} requests per {args.window:g} s (no concurrency cap); "
        f"LEDGER_POOL_RPM={args.rpm} per "
        f"{args.window:g} s: bound {rpm_bound:.2f} s"
    )
    print(line("ledger, limit 16, RPM below:", rated, rpm_bound))
    if args.provider_tpm:
        token_window(n, args.latency, args.window, args.provider_tpm)
    return 0


def token_window(n: int, latency: float, window: float, tpm: int) -> None:
    """The provider's token window, known to the ledger only from its headers."""
    tokens = 0
    for spec in specs(n):  # what the mock counts a call: its prompt and its answer (no max_tokens)
        answer = chat_answer(spec.model, None, spec.messages, None)
        tokens += answer.input_tokens + answer.output_tokens
    mock_args = ["--latency", str(latency), "--tpm", str(tpm), "--rpm-window", str(window)]
    run = ledger_run(n, mock_args, 16, LEDGER_POLL_INTERVAL=min(0.5, window / 20))
    bound = (tokens / tpm - 1) * window + latency
    print(f"provider admits {tpm} tokens per {window:g} s ({tokens} in all); no LEDGER_POOL_TPM: bound {bound:.2f} s")
    print(line("ledger, limit 16, token headers:", run, bound))


if __name__ == "__main__":
    raise SystemExit(main())
