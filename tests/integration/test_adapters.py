"""Adapters through the real openai/anthropic SDKs, over HTTP, against our mock provider."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from adapters.anthropic import AnthropicAdapter
from adapters.base import CallRequest
from adapters.compatible import CompatibleAdapter
from adapters.errors import ProviderError
from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.openai import OpenAIAdapter


@pytest.fixture(scope="module")
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider() as server:
        yield server


def call(adapter: Any, request: CallRequest, timeout: float = 5.0) -> Any:
    async def go() -> Any:
        try:
            return await adapter.call(request, timeout=timeout)
        finally:
            await adapter.aclose()

    return anyio.run(go)


def failure(adapter: Any, request: CallRequest, timeout: float = 5.0) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        call(adapter, request, timeout)
    return caught.value


def ask(text: str, **kw: Any) -> CallRequest:
    return CallRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": text}], **kw)


def openai(mock: RunningMockProvider) -> OpenAIAdapter:
    return OpenAIAdapter(api_key="k", base_url=mock.openai_base_url)


def test_openai_answer_and_usage(mock: RunningMockProvider) -> None:
    result = call(openai(mock), ask("grade this", system="You are a judge.", params={"temperature": 0}))
    assert result.text.strip().splitlines()[-1].startswith("VERDICT: ")
    assert result.input_tokens and result.output_tokens and result.status_code == 200
    assert (
        call(openai(mock), ask("grade this", system="You are a judge.", params={"temperature": 0})).text == result.text
    )


def test_openai_structured_output(mock: RunningMockProvider) -> None:
    schema = {
        "type": "object",
        "required": ["score", "argument"],
        "properties": {
            "score": {"type": "integer", "minimum": 1, "maximum": 5},
            "argument": {"type": "string"},
        },
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "opinion", "schema": schema}}
    parsed = json.loads(call(openai(mock), ask("score it", response_format=fmt)).text)
    assert set(parsed) >= {"score", "argument"} and 1 <= parsed["score"] <= 5


def test_anthropic_translation_and_answer(mock: RunningMockProvider) -> None:
    adapter = AnthropicAdapter(api_key="k", base_url=mock.anthropic_base_url)
    request = CallRequest(
        model="claude-sonnet",
        system="Be a judge.",
        params={"stop": "END", "seed": 3},
        messages=[{"role": "user", "content": "grade"}],
    )
    result = call(adapter, request)
    assert "VERDICT:" in result.text and result.input_tokens and result.output_tokens


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (408, True),
        (400, False),
        (401, False),
        (404, False),
    ],
)
def test_openai_status_classification(mock: RunningMockProvider, status: int, retryable: bool) -> None:
    error = failure(openai(mock), ask(f"status {status} [[mock:fail={status}x*]]"))
    assert (error.status_code, error.retryable) == (status, retryable)


def test_anthropic_overloaded_is_retryable(mock: RunningMockProvider) -> None:
    adapter = AnthropicAdapter(api_key="k", base_url=mock.anthropic_base_url)
    error = failure(adapter, CallRequest(model="c", messages=[{"role": "user", "content": "x [[mock:fail=529x*]]"}]))
    assert error.status_code == 529 and error.retryable


def test_rate_limit_carries_retry_after(mock: RunningMockProvider) -> None:
    error = failure(openai(mock), ask("busy [[mock:fail=429x*]] [[mock:retry_after=0.75]]"))
    assert error.retryable and error.retry_after == pytest.approx(0.75)


def test_spent_quota_is_not_retried(mock: RunningMockProvider) -> None:
    error = failure(openai(mock), ask("broke [[mock:quota]]"))
    assert (error.status_code, error.retryable, error.code) == (429, False, "insufficient_quota")
    assert error.quota is not None and error.quota.startswith("quota exhausted (insufficient_quota)")


def test_compatible_error_in_a_200_body_is_a_failure(mock: RunningMockProvider) -> None:
    adapter = CompatibleAdapter(api_key=None, base_url=mock.openai_base_url)
    error = failure(adapter, ask("proxy [[mock:error200=1]] unique-1"))
    assert error.code == "error_in_body" and error.retryable


def test_malformed_body_is_a_retryable_failure(mock: RunningMockProvider) -> None:
    error = failure(openai(mock), ask("garbled [[mock:malformed=1]] unique-2"))
    assert error.code == "malformed_response" and error.retryable


def test_anthropic_malformed_body_is_a_retryable_failure(mock: RunningMockProvider) -> None:
    adapter = AnthropicAdapter(api_key="k", base_url=mock.anthropic_base_url)
    request = CallRequest(model="c", messages=[{"role": "user", "content": "x [[mock:malformed=1]] u-4"}])
    error = failure(adapter, request)
    assert (error.code, error.status_code, error.retryable) == ("malformed_response", 200, True)


def test_anthropic_error_in_a_200_body_is_a_failure(mock: RunningMockProvider) -> None:
    adapter = AnthropicAdapter(api_key="k", base_url=mock.anthropic_base_url)
    request = CallRequest(model="c", messages=[{"role": "user", "content": "proxy [[mock:error200=1]] u-5"}])
    error = failure(adapter, request)
    assert error.code == "error_in_body" and error.retryable


def test_sdk_timeout_is_retryable(mock: RunningMockProvider) -> None:
    error = failure(openai(mock), ask("stuck [[mock:hang=1]] unique-3"), timeout=0.3)
    assert error.code == "timeout" and error.retryable
