"""Anthropic Messages through the official SDK, with the SDK's own retries off.

Requests are stored in OpenAI's vocabulary; this is where they are translated:
the system prompt becomes the `system` parameter, `max_tokens` gets the default
Anthropic requires, `stop` becomes `stop_sequences`, OpenAI-only knobs are dropped.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from adapters.base import CallRequest, CallResult, read_rate_limits, sdk_errors

DEFAULT_MAX_TOKENS = 1024
_KEEP = {"temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking", "tools", "tool_choice"}


def anthropic_params(request: CallRequest) -> dict[str, Any]:
    params = request.params
    out: dict[str, Any] = {k: v for k, v in params.items() if k in _KEEP}
    out["max_tokens"] = int(params.get("max_tokens") or params.get("max_completion_tokens") or DEFAULT_MAX_TOKENS)
    if "stop" in params and "stop_sequences" not in out:
        stop = params["stop"]
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    system = request.system or ""
    if request.response_format is not None:
        schema = request.response_format.get("json_schema", {}).get("schema", request.response_format)
        system = (system + "\n\n" if system else "") + (
            "Answer with one JSON value only, conforming to this JSON schema: " + json.dumps(schema)
        )
    if system:
        out["system"] = system
    return out


class AnthropicAdapter:
    name = "anthropic"

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        self._client = anthropic.AsyncAnthropic(api_key=api_key or "not-needed", base_url=base_url, max_retries=0)

    @property
    def supports_structured_output(self) -> bool:
        return False

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        with sdk_errors(anthropic):
            # The raw response for its rate-limit headers; parsed into the SDK's Message as usual.
            raw = await self._client.messages.with_raw_response.create(
                model=request.model,
                messages=request.messages,  # type: ignore[arg-type]
                timeout=timeout,
                **anthropic_params(request),
            )
            message = await raw.parse()
        text = "".join(block.text for block in message.content if block.type == "text")
        usage = message.usage
        return CallResult(text, usage.input_tokens, usage.output_tokens, limits=read_rate_limits(raw.headers))

    async def aclose(self) -> None:
        await self._client.close()
