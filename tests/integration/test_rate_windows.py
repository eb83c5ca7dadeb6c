"""A provider's requests window that the ledger must wait out, not turn into errors (both databases).

The mock provider plays an OpenAI-compatible proxy (LiteLLM's) in front of a model limited to a
few requests per window (`--rpm-model limited --proxy-headers`): its answers carry the limit and
what is left without a reset, its 429s no `retry-after`, only `llm_provider-retry-after` (the
window). The ledger knows nothing of the window but what those say.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from sqlalchemy import text

from adapters.mock_provider import MockProviderProcess, mock_provider_process
from ledger.daemon import run_daemon
from ledger.enqueue import RequestSpec, build_spec, to_row
from ledger.pools import endpoint_for
from ledger.settings import Settings, load_settings
from ledger.store import Store
from ledger.store.rows import AttemptFailure, Completed, PoolWindow, RetryLater
from tests.integration.store_helpers import add_requests

POOL = "mock:m"
FOUR: dict[str, Any] = {
    "lease_seconds": 30,
    "global_limit": 4,
    "pool_limit": lambda _: 4,
    "max_attempts": 3,
    "max_claims": 4,
}


def specs(n: int, model: str, prompt: str = "item", provider: str = "openai-compatible") -> list[RequestSpec]:
    return [
        build_spec(
            provider=provider,
            model=model,
            idempotency_key=f"{model}-{i}",
            messages=[{"role": "user", "content": f"{prompt} {i}"}],
        )
        for i in range(n)
    ]


def proxy(rpm: int, window: float, latency: float = 0.02) -> list[str]:
    """Mock arguments: a proxy limiting model `limited` to `rpm` calls per `window` seconds."""
    return [
        *("--latency", str(latency), "--rpm", str(rpm), "--rpm-window", str(window)),
        *("--rpm-model", "limited", "--proxy-headers"),
    ]


def settings_for(db_url: str, mock: MockProviderProcess, **env: Any) -> Settings:
    return load_settings(
        **{
            "_env_file": None,
            "LEDGER_DATABASE_URL": db_url,
            "MAX_CONCURRENT_LLM_CALLS": 10,
            "OPENAI_COMPATIBLE_BASE_URL": mock.openai_base_url,
            "OPENAI_BASE_URL": mock.openai_base_url,
            "OPENAI_API_KEY": "k",
            "LEDGER_POLL_INTERVAL": 0.1,
            **env,
        }
    )


@dataclass
class Run:
    stats: dict[str, Any]  # what the mock saw
    counts: dict[str, int]  # requests per status
    pools: dict[str, dict[str, Any]]  # `Store.pool_usage`, read when the daemon stopped
    rows: dict[str, tuple[str, int, int, str | None]]  # key -> status, attempts, parked, error message


def run(
    db_url: str,
    mock_args: list[str],
    queued: list[RequestSpec],
    done: Callable[[Store], bool] | None = None,
    deadline_s: float = 60.0,
    **env: Any,
) -> Run:
    """`queued` enqueued (pool keys as `env` says), then a daemon until idle, or with `done` until
    it says so (asked every 50 ms; past `deadline_s` the daemon stops anyway)."""
    with mock_provider_process(*mock_args) as mock:
        settings = settings_for(db_url, mock, **env)
        store = Store(db_url)
        try:
            per_model = settings.compatible_pools_per_model
            store.enqueue(
                to_row(s, settings.compatible_base_url, settings.prices, pools_per_model=per_model) for s in queued
            )
            stop = anyio.Event()

            async def watch() -> None:
                ends = time.monotonic() + deadline_s
                while not (done is not None and await anyio.to_thread.run_sync(done, store)):
                    if time.monotonic() > ends:
                        break
                    await anyio.sleep(0.05)
                stop.set()

            async def main() -> None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch)
                    await run_daemon(settings, until_idle=done is None, stop=stop, handle_signals=False)
                    tg.cancel_scope.cancel()

            anyio.run(main)
            pools = store.pool_usage()
            with store.engine.connect() as conn:
                found = conn.execute(
                    text("SELECT idempotency_key, status, attempts, parked, error_message FROM llm_requests")
                )
                rows = {str(k): (str(s), int(a), int(p), m) for k, s, a, p, m in found}
            return Run(mock.stats(), store.status_counts(), pools, rows)
        finally:
            store.close()


def test_a_compatible_servers_pools_are_keyed_per_model_when_asked() -> None:
    url = "http://127.0.0.1:4000/v1"
    assert endpoint_for("openai-compatible", "gpt-4o", url) == "http:127.0.0.1:4000"
    assert endpoint_for("openai-compatible", "gpt-4o", url, per_model=True) == "http:127.0.0.1:4000/gpt-4o"
    # Hosted providers pool per model either way.
    assert endpoint_for("openai", "gpt-4o", url, per_model=True) == "openai:gpt-4o"
    with pytest.raises(Exception, match="LEDGER_COMPATIBLE_POOLS must be url or model"):
        load_settings(_env_file=None, LEDGER_COMPATIBLE_POOLS="server")


def test_a_proxys_window_is_waited_out_and_teaches_no_concurrency_limit(db_url: str) -> None:
    """15 requests to a model the proxy limits to 6 per 2 s, 10 slots, 3 attempts each: every one
    completes, none ends `error`, and the pool has learned no concurrency limit (before, the
    window's 429s ended requests `error` after three attempts and dropped the limit to 1)."""
    n = 15
    done = run(db_url, proxy(6, 2.0), specs(n, "limited"))
    assert done.counts["completed"] == n and done.counts["error"] == 0
    assert [pool["learned_limit"] for pool in done.pools.values()] == [None]
    assert done.stats["status_counts"]["200"] == n


def test_one_models_window_does_not_hold_another_model_of_the_server(db_url: str) -> None:
    """Pools keyed per model: the proxy's limited model (2 calls per 30 s) waits for its window,
    and the other model's 12 requests all complete meanwhile, their pool neither cooled nor
    limited (keyed by the server's URL, one model's window held the other's requests too)."""

    def free_pool_done(store: Store) -> bool:
        usage = store.pool_usage()
        free = [pool for pool in usage if pool.endswith("/free")]
        return bool(free) and usage[free[0]]["queued"] == 0 and usage[free[0]]["running"] == 0

    queued = specs(4, "limited") + specs(12, "free")
    done = run(db_url, proxy(2, 30.0), queued, free_pool_done, deadline_s=20, LEDGER_COMPATIBLE_POOLS="model")
    statuses = {key: row[0] for key, row in done.rows.items()}
    assert [statuses[f"free-{i}"] for i in range(12)] == ["completed"] * 12
    # The limited model's window took 2; the other 2 wait for the next one, none ended `error`.
    assert sorted(statuses[f"limited-{i}"] for i in range(4)) == ["completed", "completed", "queued", "queued"]
    (free,) = [pool for pool in done.pools if pool.endswith("/free")]
    assert any(pool.endswith("/limited") for pool in done.pools)
    assert done.pools[free]["cooldown_until"] is None and done.pools[free]["learned_limit"] is None


def test_429s_end_a_request_only_once_they_lasted_the_give_up_time(db_url: str) -> None:
    """RETRY_MAX_ATTEMPTS=1: a request refused three times with 429 still completes (its 429s are
    counted in `parked`, not as attempts), and one refused every time ends `error` once 429s have
    refused it for LEDGER_RATE_LIMIT_GIVE_UP_SECONDS (4 s here), after many attempts."""
    queued = specs(1, "m", "[[mock:fail=429x3]] [[mock:retry_after=0.05]] passes", provider="openai")
    queued += specs(1, "n", "[[mock:fail=429x*]] [[mock:retry_after=0.05]] never", provider="openai")
    started = time.monotonic()
    done = run(
        db_url,
        ["--latency", "0.01"],
        queued,
        RETRY_MAX_ATTEMPTS=1,
        RETRY_INITIAL_DELAY=0.05,
        RETRY_MAX_DELAY=0.2,
        LEDGER_RATE_LIMIT_GIVE_UP_SECONDS=4,
    )
    assert done.rows["m-0"][:3] == ("completed", 4, 3)
    status, attempts, parked, message = done.rows["n-0"]
    assert status == "error" and attempts > 3 and parked == attempts - 1
    assert message is not None and "429s for 4 s and more" in message
    assert time.monotonic() - started >= 4  # not before the give-up time


@pytest.mark.timing
def test_a_proxys_window_is_paced_with_few_429s_near_its_bound(db_url: str) -> None:
    """The proxy of the issue on a tenth of its minute: 150 requests at 60 per 6 s (a window the
    ledger knows only from the proxy's headers and 429s), 10 slots: all complete with at most 15
    429s, within 1.4 x the window's bound (the last window's calls can start two windows after
    the first), as the provider saw it."""
    n, rpm, window, latency = 150, 60, 6.0, 0.05
    done = run(db_url, proxy(rpm, window, latency), specs(n, "limited"))
    assert done.counts["completed"] == n
    assert done.stats["status_counts"].get("429", 0) <= 15
    bound = (math.ceil(n / rpm) - 1) * window + latency
    assert done.stats["busy_seconds"] <= 1.4 * bound


def test_a_429_after_the_count_reached_zero_teaches_the_window_not_a_limit(db_url: str) -> None:
    """Answers say the window holds 4 calls and count it down to 0 without a reset; the one call
    then let through is refused without headers of its own, asking to wait 30 s. That is the
    window's refusal: no concurrency limit is learned (before: the limit fell to the calls out),
    the pool is paced to 4 calls per 30 s (and 5 %), and its 4 calls in the window, logged,
    hold it: the next claim takes nothing."""
    store = Store(db_url)
    try:
        add_requests(store, 12)
        held = store.claim("w", **FOUR).requests
        counted = [
            Completed(held[0], 1, "ok", 5, 10, 10, 200, None, PoolWindow(2, 0.0, 0.0, 4)),
            Completed(held[1], 1, "ok", 5, 10, 10, 200, None, PoolWindow(1, 0.0, 0.0, 4)),
        ]
        store.record(counted)
        (probe,) = store.claim("w", **FOUR).requests  # 1 left, less the 2 calls out: one call goes alone
        refused = AttemptFailure(429, "rate_limit_error", "requests per minute exceeded", 1)
        store.record([RetryLater(held[2], 1, refused, 30.0, False, 30.0, None, calls_out=2)])
        assert store.pool_usage()[POOL]["learned_limit"] is None
        assert (store.pool_rules.rpm[POOL], store.pool_rules.window_of(POOL)) == (4, pytest.approx(31.5))
        assert store.claim("w", **FOUR).requests == []  # held[0], held[1], held[3] and the probe
        assert probe.id not in {r.id for r in held}
    finally:
        store.close()
