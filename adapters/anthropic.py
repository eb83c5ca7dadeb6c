"""Anthropic Messages through the official SDK, with the SDK's own retries off.

The body is written by `anthropic_format.messages_body` (SDK-free, so enqueue checks a request
with it too): a request in OpenAI's or Gemini's words is translated there, and parameters the
Messages API does not take are left out.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2

from adapters.anthropic_format import messages_body
from adapters.base import (
    CallRequest,
    CallResult,
    ToolCall,
    arguments_text,
    finish_reason,
    joined,
    json_body,
    response_text,
    token_count,
    with_rate_limits,
)
from adapters.errors import malformed, raise_error_in_body, sdk_errors


class AnthropicAdapter:
    name = "anthropic"

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        self._client = anthropic.AsyncAnthropic(api_key=api_key or "not-needed", base_url=base_url, max_retries=0)

    @property
    def supports_structured_output(self) -> bool:
        return True  # `output_config.format`: a JSON schema the answer follows

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        # Through the client's generic `post`, as the OpenAI adapter does (and the batch create
        # already did): the body is built here, so the typed `create`'s walk of it against the
        # SDK's TypedDicts, and the parse into its `Message` model, would be CPU spent for nothing.
        body = messages_body(request)
        with sdk_errors(anthropic):
            response = await self._client.post(
                "/v1/messages", cast_to=httpx2.Response, body=body, options={"timeout": timeout}
            )
        text = response_text(response)
        message = json_body(text, response.status_code)
        raise_error_in_body(message, response.status_code)  # Anthropic's: {"type": "error", "error": {...}}
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            raise malformed("response has no content list", response.status_code)
        result = message_result(message, response.status_code, text)
        return with_rate_limits(result, response.headers, body["max_tokens"])

    async def aclose(self) -> None:
        await self._client.close()


# Messages' `stop_reason`, in the ledger's words.
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "refusal",
}


def message_result(message: Any, status_code: int = 200, body_text: str | None = None) -> CallResult:
    """A Messages API answer, whole (online and in batches): text blocks joined, `tool_use` blocks
    as tool calls, `thinking` blocks as thinking; input tokens counted in full (cache reads and
    cache writes are input the model read, billed at their own rates)."""
    if not isinstance(message, dict):
        message = {}
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking") or ""))
        elif kind in ("tool_use", "server_tool_use"):
            calls.append(
                ToolCall(str(block.get("id") or ""), str(block.get("name") or ""), arguments_text(block.get("input")))
            )
    said = message.get("stop_reason")
    usage = message.get("usage") or {}
    uncached = token_count(usage.get("input_tokens"))
    read = token_count(usage.get("cache_read_input_tokens"))
    written = token_count(usage.get("cache_creation_input_tokens"))
    total_in = None if uncached is None else uncached + (read or 0) + (written or 0)
    return CallResult(
        "".join(texts),
        total_in,
        token_count(usage.get("output_tokens")),
        status_code,
        finish_reason=finish_reason(said, _FINISH),
        provider_finish_reason=said if isinstance(said, str) else None,
        tool_calls=tuple(calls),
        refusal=("".join(texts) or None) if said == "refusal" else None,
        thinking=joined(thoughts),
        cached_input_tokens=read,
        cache_write_tokens=written,
        response=message,
        response_text=body_text,
    )
