"""Gemini's wire format as the mock provider speaks it: a `GenerateContentRequest` read into the
chat-shaped payload the mock's answers are made from, the `GenerateContentResponse` written from
an answer, and Gemini's error bodies (`{"error": {"code", "message", "status", "details"}}`),
among them the two kinds of 429 `RESOURCE_EXHAUSTED` a client must tell apart: a per-minute
quota (with `RetryInfo`) and a spent per-day quota.

Plain dictionaries only: `wire.py` puts them into replies.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from adapters.gemini_format import camel_fields

if TYPE_CHECKING:
    from adapters.mock_provider.answers import MockAnswer

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
    529: "UNAVAILABLE",
}
_RPC = "type.googleapis.com/google.rpc."
# What the mock's per-minute and per-day quotas are said to be (`quotaValue`).
PER_MINUTE_QUOTA = 10
PER_DAY_QUOTA = 250


def as_chat(payload: dict[str, Any], model: str) -> dict[str, Any]:
    """A Gemini request body as the chat-shaped payload `answers.model_answer` reads: system text,
    messages (role `model` is the assistant; a `functionResponse` part is a tool's result), the
    output limit, a JSON schema, function tools, and whether thoughts are asked for. (A schema's
    property names are camel-cased too: the mock's answers do not depend on them.)"""
    payload = camel_fields(payload)
    instruction = payload.get("systemInstruction") or {}
    system = "".join(str(p.get("text") or "") for p in instruction.get("parts") or [] if isinstance(p, dict))
    messages: list[dict[str, Any]] = []
    for content in payload.get("contents") or []:
        parts = [p for p in content.get("parts") or [] if isinstance(p, dict)]
        if any("functionResponse" in p for p in parts):
            messages.append({"role": "tool", "content": ""})
            continue
        text = "".join(str(p.get("text") or "") for p in parts if not p.get("thought"))
        messages.append({"role": "assistant" if content.get("role") == "model" else "user", "content": text})
    config = payload.get("generationConfig") or {}
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if system:
        chat["system"] = system
    if isinstance(config.get("maxOutputTokens"), int):
        chat["max_tokens"] = config["maxOutputTokens"]
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    if isinstance(schema, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    elif config.get("responseMimeType") == "application/json":
        chat["response_format"] = {"type": "json_object"}
    functions = [
        {"type": "function", "function": {"name": d.get("name"), "parameters": d.get("parametersJsonSchema")}}
        for tool in payload.get("tools") or []
        for d in tool.get("functionDeclarations") or []
    ]
    if functions:
        chat["tools"] = functions
    thinking = config.get("thinkingConfig") or {}
    if isinstance(thinking, dict) and thinking.get("includeThoughts"):
        chat["include_thoughts"] = True
    return chat


def answer(model: str, said: MockAnswer) -> dict[str, Any]:
    """A `GenerateContentResponse`: thoughts as `thought` parts, a refusal as a safety stop with no
    content, tool calls as `functionCall` parts; `candidatesTokenCount` leaves the thoughts out
    (they are `thoughtsTokenCount`), `promptTokenCount` counts the cached tokens in."""
    parts: list[dict[str, Any]] = []
    if said.thinking is not None:
        parts.append({"text": said.thinking, "thought": True})
    if said.text:
        parts.append({"text": said.text})
    for call_id, name, arguments in said.tool_calls:
        parts.append({"functionCall": {"id": call_id, "name": name, "args": arguments}})
    finish = {"length": "MAX_TOKENS", "refusal": "SAFETY"}.get(said.finish, "STOP")
    candidate: dict[str, Any] = {"finishReason": finish, "index": 0}
    if said.refusal is None:
        candidate["content"] = {"role": "model", "parts": parts}
    else:
        candidate["safetyRatings"] = [
            {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
        ]
    thoughts = said.reasoning_tokens
    usage: dict[str, Any] = {
        "promptTokenCount": said.input_tokens,
        "candidatesTokenCount": said.output_tokens - thoughts,
        "totalTokenCount": said.input_tokens + said.output_tokens,
    }
    if said.cached_tokens:
        usage["cachedContentTokenCount"] = said.cached_tokens
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return {
        "candidates": [candidate],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": uuid.uuid4().hex[:22],
    }


def error(status: int, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}
    if details:
        body["details"] = details
    return {"error": body}


def _quota_failure(per: str, value: int) -> dict[str, Any]:
    """A `QuotaFailure` naming the request quota per `per` (Minute, Day) and its value."""
    violation = {
        "quotaMetric": "generativelanguage.googleapis.com/generate_content_paid_tier_requests",
        "quotaId": f"GenerateRequestsPer{per}PerProjectPerModel",
        "quotaValue": str(value),
    }
    return {"@type": _RPC + "QuotaFailure", "violations": [violation]}


def per_minute_limited(retry_after: float, message: str) -> dict[str, Any]:
    """A per-minute quota's 429: which quota, its value, and when to come back."""
    details = [
        _quota_failure("Minute", PER_MINUTE_QUOTA),
        {"@type": _RPC + "RetryInfo", "retryDelay": f"{retry_after:g}s"},
    ]
    return error(429, f"You exceeded your current quota: {message}", details)


def per_day_spent() -> dict[str, Any]:
    """A spent per-day quota's 429: no retry helps before the day's end in Mountain View."""
    details = [
        _quota_failure("Day", PER_DAY_QUOTA),
        {"@type": _RPC + "Help", "links": [{"description": "Learn more", "url": "https://ai.google.dev/"}]},
    ]
    message = "You exceeded your current quota, please check your plan and billing details."
    return error(429, message, details)
