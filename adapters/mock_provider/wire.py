"""The wire formats the mock provider answers in: OpenAI and Anthropic bodies and errors.

Shared by the online routes (`server.py`) and the batch routes (`batches.py`),
so neither imports the other for them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.mock_provider import gemini_wire

if TYPE_CHECKING:
    from adapters.mock_provider.answers import MockAnswer


@dataclass
class Reply:
    """One HTTP response. `stall` (bytes, seconds): after that many body bytes, wait that long
    before the rest, so a test can act while a client has read part of a download. `delay`:
    wait before answering at all (a create call whose batch is already registered)."""

    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "application/json"
    stall: tuple[int, float] | None = None
    delay: float = 0.0  # seconds to wait before answering (the work is already done)


def json_reply(status: int, obj: Any, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, json.dumps(obj).encode(), headers or [])


def error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        408: "timeout_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")


def error_reply(wire: str, status: int, kind: str, message: str, headers: list[tuple[str, str]] | None = None) -> Reply:
    if wire == "gemini":
        return json_reply(status, gemini_wire.error(status, message), headers)
    if wire == "anthropic":
        return json_reply(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)
    return json_reply(status, {"error": {"message": message, "type": kind, "param": None, "code": kind}}, headers)


def rate_limited(wire: str, retry_after: float, message: str) -> Reply:
    if wire == "gemini":  # no Retry-After header: the delay is in the body's RetryInfo
        return json_reply(429, gemini_wire.per_minute_limited(retry_after, message))
    headers = [("retry-after", f"{retry_after:g}"), ("retry-after-ms", str(int(retry_after * 1000)))]
    return error_reply(wire, 429, "rate_limit_error", message, headers)


def openai_completion(model: str, text: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def anthropic_message(model: str, text: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


class Answered:
    """The answer bodies the mock sent, by their `id`, as JSON text: what a test compares the
    ledger's stored body with (`GET /_answered/{id}`). The newest `KEEP` only."""

    KEEP = 10_000

    def __init__(self) -> None:
        self._bodies: dict[str, dict[str, Any]] = {}

    def note(self, body: dict[str, Any]) -> dict[str, Any]:
        """Keep a body as it is sent (it is not changed after: `json_reply` writes it at once, a
        batch's results file when the batch ends); written out as JSON only when asked for."""
        self._bodies[str(body.get("id") or body.get("responseId"))] = body  # Gemini's: `responseId`
        if len(self._bodies) > self.KEEP:
            del self._bodies[next(iter(self._bodies))]
        return body

    def text(self, answer_id: str) -> str | None:
        body = self._bodies.get(answer_id)
        return None if body is None else json.dumps(body)


# The model the mock's Azure deployments serve, unless a deployment is named after a model.
AZURE_DEFAULT_MODEL = "gpt-4o-mini-2024-07-18"


def azure_model(deployment: str) -> str:
    """The model an Azure deployment of the mock answers as: its own name when that is an OpenAI
    model's (`gpt-4o`, `o3-mini`), else AZURE_DEFAULT_MODEL (deployment names are the user's)."""
    return deployment if deployment.startswith(("gpt-", "o1", "o3", "o4")) else AZURE_DEFAULT_MODEL


def answer_body(wire: str, model: str, answer: MockAnswer, request: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole answer in a wire format: `chat`, `responses`, `anthropic` or `gemini` (`request`:
    the body asked, which a Responses object repeats)."""
    if wire == "gemini":
        return gemini_wire.answer(model, answer)
    if wire == "anthropic":
        return anthropic_answer(model, answer)
    if wire == "responses":
        return responses_answer(model, answer, request or {})
    return chat_answer_body(model, answer)


def chat_answer_body(model: str, answer: MockAnswer) -> dict[str, Any]:
    body = openai_completion(model, answer.text, answer.input_tokens, answer.output_tokens)
    choice = body["choices"][0]
    message = choice["message"]
    message["refusal"] = answer.refusal
    if answer.refusal is not None:
        message["content"] = None  # OpenAI: a refusal comes instead of content, finish_reason "stop"
    elif answer.tool_calls:
        message["content"] = None
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for call_id, name, arguments in answer.tool_calls
        ]
    choice["finish_reason"] = {"length": "length", "tool_calls": "tool_calls"}.get(answer.finish, "stop")
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": answer.cached_tokens, "audio_tokens": 0}
    body["usage"]["completion_tokens_details"] = {"reasoning_tokens": answer.reasoning_tokens, "audio_tokens": 0}
    return body


def _as_asked(request: dict[str, Any]) -> dict[str, Any]:
    """What a Responses object repeats of its request (each field the API always returns, with
    the API's default when the request left it out)."""
    return {
        "instructions": request.get("instructions"),
        "metadata": request.get("metadata") or {},
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature", 1.0),
        "top_p": request.get("top_p", 1.0),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools", []),
        "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "text": request.get("text") or {"format": {"type": "text"}},
        "truncation": request.get("truncation") or "disabled",
        "service_tier": "default",
    } | ({"user": request["user"]} if "user" in request else {})


def responses_answer(model: str, answer: MockAnswer, request: dict[str, Any] | None = None) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if answer.thinking is not None:
        summary = [{"type": "summary_text", "text": answer.thinking}]
        output.append({"id": f"rs_{uuid.uuid4().hex[:24]}", "type": "reasoning", "summary": summary})
    if answer.refusal is not None:
        content: list[dict[str, Any]] = [{"type": "refusal", "refusal": answer.refusal}]
    else:
        text = {"type": "output_text", "text": answer.text, "annotations": [], "logprobs": []}
        content = [text] if answer.text else []
    if content:
        output.append(
            {
                "id": f"msg_{uuid.uuid4().hex[:24]}",
                "type": "message",
                "status": "incomplete" if answer.finish == "length" else "completed",
                "role": "assistant",
                "content": content,
            }
        )
    for call_id, name, arguments in answer.tool_calls:
        output.append(
            {
                "id": f"fc_{uuid.uuid4().hex[:24]}",
                "type": "function_call",
                "status": "completed",
                "call_id": call_id,
                "name": name,
                "arguments": json.dumps(arguments),
            }
        )
    cut = answer.finish == "length"
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model,
        "output": output,
        **_as_asked(request or {}),
        "usage": {
            "input_tokens": answer.input_tokens,
            "input_tokens_details": {"cached_tokens": answer.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": answer.output_tokens,
            "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
            "total_tokens": answer.input_tokens + answer.output_tokens,
        },
    }


def anthropic_answer(model: str, answer: MockAnswer) -> dict[str, Any]:
    uncached = answer.input_tokens - answer.cached_tokens - answer.cache_write_tokens
    body = anthropic_message(model, answer.text, uncached, answer.output_tokens)
    content: list[dict[str, Any]] = []
    if answer.thinking is not None:
        content.append({"type": "thinking", "thinking": answer.thinking, "signature": uuid.uuid4().hex})
    if answer.refusal is not None:
        content.append({"type": "text", "text": answer.refusal})
    elif answer.text:
        content.append({"type": "text", "text": answer.text})
    for call_id, name, arguments in answer.tool_calls:
        content.append({"type": "tool_use", "id": "toolu_" + call_id[5:], "name": name, "input": arguments})
    body["content"] = content
    body["stop_reason"] = {"length": "max_tokens", "tool_calls": "tool_use", "refusal": "refusal"}.get(
        answer.finish, "end_turn"
    )
    body["usage"]["cache_read_input_tokens"] = answer.cached_tokens
    body["usage"]["cache_creation_input_tokens"] = answer.cache_write_tokens
    return body
