"""Pool keys and the retry policy."""

from __future__ import annotations

import httpx2
import pytest

from adapters.base import CallResult, tokens_counted
from adapters.errors import ProviderError, classify_status
from adapters.rate_limits import RateLimits, read_rate_limits, retry_after_seconds
from ledger.pools import endpoint_for, normalize_endpoint
from ledger.retry import JITTER_MAX_S, RetryPolicy


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("openai:gpt-4o", "openai:gpt-4o"),
        ("http://api.example.com:8080/v1", "http:api.example.com:8080"),
        ("https://openrouter.ai/api/v1", "https:openrouter.ai"),
        ("gpt-4o", "id:gpt-4o"),
    ],
)
def test_endpoint_normalisation(raw: str, key: str) -> None:
    assert normalize_endpoint(raw) == key


def test_compatible_servers_pool_by_url_hosted_ones_by_model() -> None:
    assert endpoint_for("openai-compatible", "llama3", "http://localhost:11434/v1") == "http:localhost:11434"
    assert endpoint_for("openai", "gpt-4o", "http://localhost:11434/v1") == "openai:gpt-4o"


def test_backoff_doubles_with_bounded_jitter_and_caps() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=60.0, max_attempts=10)
    for attempt in range(1, 9):
        base = min(2 ** (attempt - 1), 60.0)
        for _ in range(20):
            delay = policy.delay(attempt)
            assert base <= delay <= min(base + JITTER_MAX_S, 60.0)


def test_retry_after_wins_when_larger_and_is_capped() -> None:
    policy = RetryPolicy(initial_delay=0.1, max_delay=10.0)
    assert policy.delay(1, retry_after=4.0) == 4.0
    assert policy.delay(1, retry_after=500.0) == 10.0
    assert policy.delay(5, retry_after=0.01) >= 1.6  # backoff larger than the hint


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 529])
def test_transient_statuses_are_retried(status: int) -> None:
    assert classify_status(status, "x").retryable


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_are_not_retried(status: int) -> None:
    assert not classify_status(status, "x").retryable


def test_insufficient_quota_429_is_not_retried() -> None:
    body = {"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "quota"}}
    error = classify_status(429, "quota", body)
    assert not error.retryable and error.code == "insufficient_quota"


def test_attempt_budget_is_respected() -> None:
    policy = RetryPolicy(max_attempts=3)
    transient = ProviderError("busy", status_code=503, retryable=True)
    assert policy.should_retry(transient, 2) and not policy.should_retry(transient, 3)


def test_retry_after_headers() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None


def test_azures_and_a_proxys_waits_are_read() -> None:
    """Azure's `retry-after-ms` alone, and the wait of the provider behind an OpenAI-compatible
    proxy (LiteLLM passes it on as `llm_provider-retry-after`, with no `retry-after` of its own):
    each is the wait a 429 asks for. The server's own header wins over the one passed on."""
    assert retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_seconds({"llm_provider-retry-after": "60"}) == 60.0
    assert retry_after_seconds({"llm_provider-retry-after-ms": "2500"}) == 2.5
    assert retry_after_seconds({"retry-after": "3", "llm_provider-retry-after": "60"}) == 3.0
    refused = classify_status(429, "rate limited", None, {"llm_provider-retry-after": "60"})
    assert refused.retryable and refused.retry_after == 60.0


def test_a_window_counted_down_without_a_reset_says_its_size() -> None:
    """A proxy's answer: the window's size and what is left, no reset (0: not said)."""
    limits = read_rate_limits({"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59"})
    assert limits is not None and limits.limit_requests == 60 and limits.reset_requests_s is None
    assert limits.window() == (59, 0.0)


def test_a_token_window_is_counted_in_calls_before_it_is_spent() -> None:
    # 900 tokens left at 200 a call: room for 4 calls, before the requests count's 10.
    limits = RateLimits(
        remaining_requests=10, remaining_tokens=900, reset_requests_s=1, reset_tokens_s=6, call_tokens=(150, 50)
    )
    assert limits.window() == (4, 6)
    # The requests count is the tighter: its reset counts.
    limits = RateLimits(remaining_requests=2, remaining_tokens=900, reset_requests_s=1, call_tokens=(150, 50))
    assert limits.window() == (2, 1)
    # Without a call's cost (a 429 has no usage), only spent tokens close the window.
    assert RateLimits(remaining_tokens=900, reset_tokens_s=6).window() is None
    assert RateLimits(remaining_tokens=0, reset_tokens_s=6).window() == (0, 6)


def test_anthropics_input_and_output_limits_each_count_their_own_part_of_a_call() -> None:
    """5,000 output tokens left and 400,000 input tokens: calls of 8,000 in and 1,024 out fit
    4 times (the output limit), not 0 (5,000 over the whole call's 9,024)."""
    headers = {
        "anthropic-ratelimit-requests-remaining": "100",
        "anthropic-ratelimit-input-tokens-remaining": "400000",
        "anthropic-ratelimit-output-tokens-remaining": "5000",
        "anthropic-ratelimit-output-tokens-reset": "2026-11-27T00:00:30Z",
    }
    limits = read_rate_limits(headers)
    assert limits is not None and limits.remaining_tokens is None and limits.counts_tokens
    assert (limits.remaining_input_tokens, limits.remaining_output_tokens) == (400_000, 5_000)
    from dataclasses import replace

    window = replace(limits, call_tokens=(8_000, 1_024)).window()
    assert window is not None and window[0] == 4
    # The combined limit, when Anthropic sends it, counts the whole call.
    both = replace(limits, remaining_tokens=20_000, call_tokens=(8_000, 1_024)).window()
    assert both is not None and both[0] == 2


def test_tokens_counted_is_the_prompt_and_max_tokens_or_else_the_usage() -> None:
    answer = CallResult("ok", input_tokens=120, output_tokens=30)
    assert tokens_counted(answer, 500) == (120, 500)
    assert tokens_counted(answer, None) == (120, 30)
    assert tokens_counted(answer, True) == (120, 30)  # not a number of tokens
    assert tokens_counted(CallResult("ok"), 500) is None


def test_a_spent_balance_is_told_apart_from_a_bad_request_and_from_a_rate_limit() -> None:
    balance = "400: Your credit balance is too low to access the Anthropic API."
    spent = classify_status(400, balance, {"type": "error", "error": {"type": "invalid_request_error"}})
    assert (spent.retryable, spent.code) == (False, "credit_balance_too_low")
    assert spent.quota is not None and spent.quota.startswith("credit balance too low")
    assert classify_status(400, "400: max_tokens too large").quota is None
    assert classify_status(429, "429: slow down", {"error": {"code": "rate_limit_exceeded"}}).quota is None


def test_rate_limit_headers_are_read_whatever_case_the_provider_wrote_them_in() -> None:
    """An HTTP client's headers (names case-insensitive, a repeated one joined), as an answer carries them."""
    headers = httpx2.Headers(
        [
            ("X-RateLimit-Remaining-Requests", "59"),
            ("x-ratelimit-limit-requests", "60"),
            ("X-RateLimit-Reset-Requests", "1s"),
            ("x-ratelimit-remaining-tokens", "1000"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]
    )
    limits = read_rate_limits(headers)
    assert limits is not None
    assert (limits.remaining_requests, limits.limit_requests, limits.reset_requests_s) == (59, 60, 1.0)
    assert (limits.remaining_tokens, limits.reset_tokens_s) == (1000, 360.0)
    assert read_rate_limits(httpx2.Headers([("content-type", "application/json")])) is None
