"""Pools slowed before the 429: providers' rate-limit headers, RPM/TPM caps, slow start (both databases).

Headers are read through the real openai/anthropic SDKs from the mock provider, whose
`--rpm` and `--tpm` caps answer with them (remaining requests or tokens, when the window has
room again).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from sqlalchemy import text

from adapters.anthropic import AnthropicAdapter
from adapters.base import CallRequest
from adapters.errors import ProviderError
from adapters.mock_provider import mock_provider_process, running_mock_provider
from adapters.mock_provider.answers import chat_answer
from adapters.openai import OpenAIAdapter
from adapters.rate_limits import reset_seconds
from ledger.daemon import run_daemon
from ledger.enqueue import RequestSpec, build_spec, to_row
from ledger.settings import SettingsError, load_settings, parse_pool_limits
from ledger.store import Store
from ledger.store.pools import RAMP_STEP, PoolRules
from ledger.store.rows import AttemptFailure, ClaimedRequest, Completed, RetryLater
from tests.integration.store_helpers import add_requests

POOL = "mock:m"
# The slow-start tests' limits: room enough that only the ramp holds a pool back.
SIXTEEN_SLOTS: dict[str, Any] = {
    "lease_seconds": 30,
    "global_limit": 16,
    "pool_limit": lambda _: 16,
    "max_attempts": 5,
    "max_claims": 16,
}


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()


def claim(store: Store, n: int = 16) -> list[ClaimedRequest]:
    return store.claim(
        "w", lease_seconds=30, global_limit=16, pool_limit=lambda _: 16, max_attempts=5, max_claims=n
    ).requests


def poll(fetch: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- settings ------------------------------------------------------------------------------


def test_rpm_and_tpm_are_read_like_pool_limits_and_name_their_variable() -> None:
    settings = load_settings(
        _env_file=None, LEDGER_POOL_RPM="openai:gpt-4o-mini=500, http://gpu:8000/v1=60", LEDGER_POOL_TPM="mock:m=9000"
    )
    rules = settings.pool_rules
    assert dict(rules.rpm) == {"openai:gpt-4o-mini": 500, "http:gpu:8000": 60}
    assert dict(rules.tpm) == {"mock:m": 9000} and rules.window_s == 60.0 and rules.slow_start
    with pytest.raises(SettingsError, match="LEDGER_POOL_TPM item 'mock:m=lots'"):
        load_settings(_env_file=None, LEDGER_POOL_TPM="mock:m=lots")
    with pytest.raises(ValueError, match="LEDGER_POOL_RPM item 'x=0': limit must be >= 1"):
        parse_pool_limits("x=0", "LEDGER_POOL_RPM")


# -- RPM / TPM at claim time -----------------------------------------------------------------


def test_an_rpm_cap_holds_the_pool_and_never_another_pool(store: Store) -> None:
    store.pool_rules = PoolRules(rpm={POOL: 3}, window_s=0.5)
    add_requests(store, 6)
    add_requests(store, 2, model="other")
    first = claim(store)
    assert sorted(r.endpoint for r in first) == [POOL] * 3 + ["mock:other"] * 2
    store.record([Completed(r, 1, "ok", 5, 10, 10) for r in first])
    assert claim(store) == []  # slots free, but 3 calls already started in this window
    started = time.monotonic()
    again = poll(lambda: claim(store))  # the window slides: its oldest calls leave it
    assert time.monotonic() - started > 0.3  # not before
    while len(again) < 3:  # the three calls started a moment apart: they leave it so
        again += poll(lambda: claim(store))
    assert len(again) == 3


def test_a_tpm_cap_reserves_the_estimate_and_settles_with_the_usage(store: Store) -> None:
    store.pool_rules = PoolRules(tpm={POOL: 1000}, window_s=30)
    add_requests(store, 6, max_tokens=300)  # estimate: 300 + a few prompt bytes / 3 each
    held = claim(store)
    assert len(held) == 3  # 3 x ~305 fit in 1,000; a 4th does not
    store.record([Completed(held[0], 1, "ok", 5, 10, 20)])  # used 30, not ~305
    assert len(claim(store)) == 1  # what the settled call gave back fits one more
    refused = AttemptFailure(429, "rate_limit", "busy", 1)
    store.record([RetryLater(held[1], 1, refused, 0.0, hold_slot=False, calls_out=15)])
    assert len(claim(store)) == 1  # a refused call used no tokens


def test_a_retry_holding_its_slot_waits_for_a_full_window(store: Store) -> None:
    store.pool_rules = PoolRules(rpm={POOL: 1}, window_s=30)
    add_requests(store, 1)
    (call,) = claim(store)
    store.record([RetryLater(call, 1, AttemptFailure(503, "http_503", "down", 1), 0.0, hold_slot=True)])
    after = store.begin_attempt(call)
    assert after.number is None and after.yielded  # its slot goes back; the claim waits for the window


# -- slow start ----------------------------------------------------------------------------------


def test_slow_start_opens_one_slot_more_when_all_are_busy(store: Store) -> None:
    store.pool_rules = PoolRules(slow_start=True)
    add_requests(store, 20)
    first = store.claim("w", lease_seconds=30, global_limit=16, pool_limit=lambda _: 16, max_attempts=5, max_claims=16)
    assert len(first.requests) == 1 and first.ramping
    assert len(claim(store)) == 1  # 1 busy = the peak: one more
    store.record([Completed(first.requests[0], 1, "ok", 5)])
    assert len(claim(store)) == 1  # 1 busy < the peak of 2: refilled only
    assert len(claim(store)) == 1  # 2 busy: one more, peak 3
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT peak FROM llm_pools")).scalar_one() == 3


def test_a_group_commit_whose_answers_prove_the_peak_opens_one_more_at_once(store: Store) -> None:
    """At low latency the calls are answered before the claim loop's pace is up: the group commit's
    own claim sees every slot of the peak busy until its answers, and opens one more then."""
    store.pool_rules = PoolRules(slow_start=True)
    add_requests(store, 20)
    (call,) = store.claim("w", **SIXTEEN_SLOTS).requests  # the peak is 1
    recorded = store.record([Completed(call, 1, "ok", 5)], claim_for="w", **SIXTEEN_SLOTS)
    assert recorded.claim is not None and len(recorded.claim.requests) == 2  # refilled, and one more
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT peak FROM llm_pools")).scalar_one() == 2


def test_answers_at_a_full_peak_open_a_slot_more_each_a_step_at_a_time(store: Store) -> None:
    """A group commit whose answers freed every slot of the peak opens one more per answer, at
    most RAMP_STEP: a fresh pool at zero latency ramps in a few group commits, not one per slot,
    and a peak already at the provider's ceiling oversteps it by at most the step."""
    store.pool_rules = PoolRules(slow_start=True)
    add_requests(store, 60)
    in_flight = store.claim("w", **SIXTEEN_SLOTS).requests
    sizes = []
    for _ in range(6):
        recorded = store.record([Completed(r, 1, "ok", 5) for r in in_flight], claim_for="w", **SIXTEEN_SLOTS)
        assert recorded.claim is not None
        in_flight = recorded.claim.requests
        sizes.append(len(in_flight))
    assert RAMP_STEP == 2 and sizes == [2, 4, 6, 8, 10, 12]  # one more per answer, at most two a step


def test_answers_while_part_of_the_peak_is_idle_only_refill(store: Store) -> None:
    """Growth needs the whole peak busy: an answer from a pool that had an idle slot proves nothing."""
    store.pool_rules = PoolRules(slow_start=True)
    add_requests(store, 2)
    (a,) = store.claim("w", **SIXTEEN_SLOTS).requests
    (b,) = store.claim("w", **SIXTEEN_SLOTS).requests  # one busy = the peak: one more, the peak is 2
    drained = store.record([Completed(a, 1, "ok", 5)], claim_for="w", **SIXTEEN_SLOTS)
    assert drained.claim is not None and drained.claim.requests == []  # nothing queued: a slot stays idle
    add_requests(store, 10, prefix="more")
    recorded = store.record([Completed(b, 1, "ok", 5)], claim_for="w", **SIXTEEN_SLOTS)
    assert recorded.claim is not None and len(recorded.claim.requests) == 2  # refilled to the peak only


# -- the providers' rate-limit headers -------------------------------------------------------------


def test_reset_times_in_each_providers_format() -> None:
    assert reset_seconds("6m0s") == 360 and reset_seconds("1s") == 1 and reset_seconds("20ms") == 0.02
    assert reset_seconds("1h2m3.5s") == 3723.5 and reset_seconds("0.5") == 0.5
    assert reset_seconds("2000-01-01T00:00:00Z") == 0.0  # already past
    soon = reset_seconds(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30)))
    assert soon is not None and 25 < soon <= 30
    assert reset_seconds("whenever") is None and reset_seconds(None) is None


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_adapters_surface_the_rate_limit_headers_on_answers_and_on_429s(provider: str) -> None:
    with running_mock_provider(rpm=2, rpm_window=30) as mock:
        adapter: Any = (
            OpenAIAdapter(api_key="k", base_url=mock.openai_base_url)
            if provider == "openai"
            else AnthropicAdapter(api_key="k", base_url=mock.anthropic_base_url)
        )
        request = CallRequest(model="m", messages=[{"role": "user", "content": "hi"}])

        async def go() -> tuple[list[Any], ProviderError]:
            try:
                answers = [await adapter.call(request, timeout=5) for _ in range(2)]
                with pytest.raises(ProviderError) as refused:
                    await adapter.call(request, timeout=5)
                return answers, refused.value
            finally:
                await adapter.aclose()

        answers, refused = anyio.run(go)
    assert [a.limits.remaining_requests for a in answers] == [1, 0]
    assert all(0 < a.limits.reset_requests_s <= 30 for a in answers)
    assert refused.status_code == 429 and refused.limits is not None
    assert refused.limits.remaining_requests == 0 and refused.limits.window() is not None


@dataclass(frozen=True)
class MockRun:
    """A daemon's run until idle against a mock provider process: what each side saw."""

    stats: dict[str, Any]  # the provider's (`/_stats`)
    counts: dict[str, int]  # requests per status
    pools: dict[str, dict[str, Any]]  # `Store.pool_usage`
    cooled: Any  # the pool's last `cooldown_until`, None if it never cooled down
    elapsed: float


def run_against_mock(db_url: str, mock_args: list[str], specs: list[RequestSpec], **env: Any) -> MockRun:
    """`specs` queued, then a daemon (4 slots, keys for both providers, unless `env` says) until idle
    against a mock provider process started with `mock_args`."""
    with mock_provider_process(*mock_args) as mock:
        settings = load_settings(
            **{
                "_env_file": None,
                "LEDGER_DATABASE_URL": db_url,
                "MAX_CONCURRENT_LLM_CALLS": 4,
                "OPENAI_BASE_URL": mock.openai_base_url,
                "ANTHROPIC_BASE_URL": mock.anthropic_base_url,
                "OPENAI_API_KEY": "k",
                "ANTHROPIC_API_KEY": "k",
                "LEDGER_POLL_INTERVAL": 0.1,
                **env,
            }
        )
        store = Store(db_url)
        try:
            store.enqueue(to_row(spec) for spec in specs)
            started = time.monotonic()
            anyio.run(lambda: run_daemon(settings, until_idle=True, handle_signals=False))
            elapsed = time.monotonic() - started
            with store.engine.connect() as conn:
                cooled = conn.execute(text("SELECT max(cooldown_until) FROM llm_pools")).scalar_one()
            return MockRun(mock.stats(), store.status_counts(), store.pool_usage(), cooled, elapsed)
        finally:
            store.close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_headers_slow_the_pool_down_before_a_429(db_url: str, provider: str) -> None:
    """The provider takes 4 requests per 1.5 s and says so in its headers; the ledger has no RPM
    configured, 4 slots, 10 requests: it waits for the window each time, and is never refused."""
    n, model = 10, "gpt-4o-mini" if provider == "openai" else "claude-haiku"
    specs = [
        build_spec(provider=provider, model=model, idempotency_key=f"h{i}", messages=[{"role": "user", "content": "x"}])
        for i in range(n)
    ]
    run = run_against_mock(db_url, ["--latency", "0.05", "--rpm", "4", "--rpm-window", "1.5"], specs)
    assert run.counts["completed"] == n
    assert run.stats["status_counts"] == {"200": n}  # not one 429
    assert run.cooled is not None  # the window was spent and the pool waited for it
    assert run.elapsed >= 2 * 1.5  # 10 requests at 4 per window: three windows


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_adapters_surface_the_token_headers(provider: str) -> None:
    """Both providers count a call's prompt and `max_tokens` against the window when it is
    admitted: the adapters read what is left, and what one such call costs."""
    request = CallRequest(model="m", messages=[{"role": "user", "content": "hi"}], params={"max_tokens": 40})
    used = chat_answer("m", None, request.messages, None).input_tokens + 40
    with running_mock_provider(tpm=10 * used, rpm_window=30) as mock:
        adapter: Any = (
            OpenAIAdapter(api_key="k", base_url=mock.openai_base_url)
            if provider == "openai"
            else AnthropicAdapter(api_key="k", base_url=mock.anthropic_base_url)
        )

        async def go() -> list[Any]:
            try:
                return [await adapter.call(request, timeout=5) for _ in range(2)]
            finally:
                await adapter.aclose()

        answers = anyio.run(go)
    assert [a.limits.remaining_tokens for a in answers] == [9 * used, 8 * used]
    assert all(0 < a.limits.reset_tokens_s <= 30 for a in answers)
    assert [a.limits.call_tokens for a in answers] == [(used - 40, 40)] * 2
    assert answers[1].limits.window()[0] == 8  # calls the tokens left still pay for


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_token_headers_slow_the_pool_down_before_a_429(db_url: str, provider: str) -> None:
    """The provider admits 4.5 calls' worth of tokens per 1.5 s and says what is left in its token
    headers (no requests headers); the ledger has no TPM configured, 4 slots, 10 requests: it turns
    the tokens left into calls at what one call is counted, so the half call left is no room (a
    5th call would be refused), waits for the window, and is never refused."""
    n, model = 10, "gpt-4o-mini" if provider == "openai" else "claude-haiku"
    messages = [{"role": "user", "content": "x"}]
    per_call = chat_answer(model, None, messages, None).input_tokens + 32  # the prompt and max_tokens
    specs = [
        build_spec(
            provider=provider, model=model, idempotency_key=f"t{i}", messages=messages, params={"max_tokens": 32}
        )
        for i in range(n)
    ]
    tpm = 4 * per_call + per_call // 2
    run = run_against_mock(db_url, ["--latency", "0.05", "--tpm", str(tpm), "--rpm-window", "1.5"], specs)
    assert run.counts["completed"] == n
    assert run.stats["status_counts"] == {"200": n}  # not one 429
    assert run.elapsed >= 2 * 1.5  # 10 calls at 4 calls' tokens per window: three windows


def test_a_token_429_cools_the_pool_and_teaches_no_concurrency_limit(db_url: str) -> None:
    """The provider admits 2.5 calls' worth of tokens per 2 s; the ledger (4 slots) knows nothing
    of it when it starts, so its third call is refused while two are out, with tokens still left
    (half a call's). Read with the refused call's own estimate (its prompt and `max_tokens`), that
    is a spent window: the pool waits for it, and learns no concurrency limit of 2."""
    n, model = 6, "gpt-4o-mini"
    messages = [{"role": "user", "content": "x"}]
    per_call = chat_answer(model, None, messages, None).input_tokens + 32
    specs = [
        build_spec(model=model, idempotency_key=f"r{i}", messages=messages, params={"max_tokens": 32}) for i in range(n)
    ]
    tpm = 2 * per_call + per_call // 2
    mock_args = ["--latency", "0.3", "--tpm", str(tpm), "--rpm-window", "2"]
    run = run_against_mock(db_url, mock_args, specs, RETRY_MAX_ATTEMPTS=10)
    assert run.counts["completed"] == n
    assert run.stats["status_counts"].get("429", 0) >= 1  # the window was found the hard way once
    assert run.pools["openai:gpt-4o-mini"]["learned_limit"] is None  # and taught no concurrency limit


def test_a_429_leaves_the_window_an_earlier_answer_announced(store: Store) -> None:
    """A refusal whose headers still show room for other calls (the refused one did not fit)
    does not lift the window an earlier answer set: that would speed the pool into more 429s."""
    from ledger.store.rows import PoolWindow

    add_requests(store, 4)
    held = claim(store, 2)
    store.record([Completed(held[0], 1, "ok", 5, 10, 10, 200, None, PoolWindow(3, 30.0))])
    claim(store, 1)  # this claim finds the pool held to the window
    refused = RetryLater(
        held[1], 1, AttemptFailure(429, "rate_limit", "tpm", 1), 2.0, False, None, PoolWindow(60, 1.0), calls_out=2
    )
    store.record([refused])
    with store.engine.connect() as conn:
        left = conn.execute(text("SELECT window_left FROM llm_pools WHERE endpoint = :e"), {"e": POOL}).scalar_one()
    assert left is not None


def test_a_429_saying_the_window_is_spent_cools_the_pool_and_teaches_no_limit(store: Store) -> None:
    from ledger.store.rows import PoolWindow

    add_requests(store, 4)
    held = claim(store, 4)
    refused = RetryLater(
        held[0], 1, AttemptFailure(429, "rate_limit", "rpm", 1), 2.0, False, 2.0, PoolWindow(0, 2.0), calls_out=3
    )
    store.record([refused])
    usage = store.pool_usage()[POOL]
    assert usage["learned_limit"] is None and usage["cooldown_until"] is not None
