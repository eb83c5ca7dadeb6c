"""Gemini's wire format and errors, as pure functions: the request written from the ledger's
vocabulary and read back from a Gemini line, an answer read whole, and which 429 pauses a pool
until when."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from adapters.base import CallRequest
from adapters.gemini import gemini_failure, seconds_to_quota_day_end
from adapters.gemini_format import content_result, ledger_fields, wire_request

RPC = "type.googleapis.com/google.rpc."


def test_a_stored_request_becomes_a_generate_content_request() -> None:
    call = CallRequest(
        model="gemini-2.5-flash",
        system="Judge fairly.",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Rate it."},
            {"role": "assistant", "content": [{"type": "text", "text": "Which scale?"}]},
            {"role": "user", "content": "1 to 5."},
        ],
        params={"temperature": 0, "max_tokens": 50, "stop": "END", "top_p": 0.9, "logit_bias": {"1": 2}},
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
    )
    body = wire_request(call)
    assert body["systemInstruction"] == {"parts": [{"text": "Judge fairly.\n\nBe brief."}]}
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    assert body["contents"][1]["parts"] == [{"text": "Which scale?"}]
    assert body["generationConfig"] == {
        "temperature": 0,
        "maxOutputTokens": 50,
        "stopSequences": ["END"],
        "topP": 0.9,
        "responseMimeType": "application/json",
        "responseJsonSchema": {"type": "object"},
    }  # OpenAI-only knobs (logit_bias) are not sent


def test_a_gemini_line_reads_back_to_the_same_wire_request() -> None:
    request = {
        "contents": [
            {"role": "user", "parts": [{"text": "Hi"}, {"inlineData": {"mimeType": "image/png", "data": "AA"}}]}
        ],
        "systemInstruction": {"parts": [{"text": "Be kind."}]},
        "generationConfig": {"temperature": 0.5, "maxOutputTokens": 10, "thinkingConfig": {"thinkingBudget": 0}},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
    }
    fields = ledger_fields(request)
    assert fields["params"]["max_tokens"] == 10 and fields["system"] == "Be kind."
    call = CallRequest(model="m", messages=fields["messages"], system=fields["system"], params=fields["params"])
    assert wire_request(call) == request  # non-text parts and Gemini's own knobs pass through unchanged


def test_an_answer_is_read_whole() -> None:
    body = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "Weighing it.", "thought": True},
                        {"text": "VERDICT: 4"},
                        {"functionCall": {"name": "lookup", "args": {"b": 1, "a": 2}}},
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 100,
            "cachedContentTokenCount": 60,
            "candidatesTokenCount": 20,
            "thoughtsTokenCount": 30,
        },
    }
    result = content_result(body)
    assert result.text == "VERDICT: 4" and result.thinking == "Weighing it."
    assert result.tool_calls[0].arguments == '{"a":2,"b":1}' and result.finish_reason == "tool_calls"
    assert (result.input_tokens, result.cached_input_tokens) == (100, 60)
    assert (result.output_tokens, result.reasoning_tokens) == (50, 30)  # thoughts are billed as output


@pytest.mark.parametrize(
    "said,finish", [("MAX_TOKENS", "length"), ("SAFETY", "content_filter"), ("PROHIBITED_CONTENT", "content_filter")]
)
def test_finish_reasons_in_the_ledgers_words(said: str, finish: str) -> None:
    result = content_result({"candidates": [{"finishReason": said}], "usageMetadata": {"promptTokenCount": 3}})
    assert (result.finish_reason, result.provider_finish_reason) == (finish, said)


def test_a_blocked_prompt_is_a_content_filter_answer() -> None:
    result = content_result({"promptFeedback": {"blockReason": "SAFETY"}})
    assert (result.finish_reason, result.provider_finish_reason, result.text) == ("content_filter", "SAFETY", "")


def quota_error(quota_id: str, delay: str | None = None) -> dict[str, object]:
    details: list[dict[str, object]] = [
        {"@type": RPC + "QuotaFailure", "violations": [{"quotaId": quota_id, "quotaValue": "10"}]}
    ]
    if delay is not None:
        details.append({"@type": RPC + "RetryInfo", "retryDelay": delay})
    return {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota", "details": details}}


def test_a_per_day_quota_pauses_until_the_daily_reset_a_per_minute_one_is_retried() -> None:
    daily = gemini_failure(429, "RESOURCE_EXHAUSTED", "quota", quota_error("GenerateRequestsPerDayPerProjectPerModel"))
    assert daily.quota is not None and not daily.retryable and daily.quota_for is not None
    minute = gemini_failure(
        429, "RESOURCE_EXHAUSTED", "quota", quota_error("GenerateRequestsPerMinutePerProjectPerModel", "17s")
    )
    assert minute.quota is None and minute.retryable and minute.retry_after == 17.0
    assert minute.limits is not None and minute.limits.window() == (0, 17.0)
    assert gemini_failure(500, "INTERNAL", "oops", {}).retryable


@pytest.mark.parametrize(
    "now,seconds",
    [
        (datetime(2026, 1, 15, 7, 0, tzinfo=UTC), 3600.0),  # 23:00 PST: an hour to go
        (datetime(2026, 7, 15, 6, 0, tzinfo=UTC), 3600.0),  # 23:00 PDT: an hour to go
        (datetime(2026, 3, 8, 9, 0, tzinfo=UTC), 22 * 3600.0),  # 01:00 on the day clocks spring forward
    ],
)
def test_the_quota_day_ends_at_midnight_in_los_angeles(now: datetime, seconds: float) -> None:
    assert seconds_to_quota_day_end(now) == pytest.approx(seconds)
