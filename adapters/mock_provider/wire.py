"""The wire formats the mock provider answers in: OpenAI and Anthropic bodies and errors.

Shared by the online routes (`server.py`) and the batch routes (`batches.py`),
so neither imports the other for them.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any


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
    if wire == "anthropic":
        return json_reply(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)
    return json_reply(status, {"error": {"type": kind, "code": kind, "message": message}}, headers)


def rate_limited(wire: str, retry_after: float, message: str) -> Reply:
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
