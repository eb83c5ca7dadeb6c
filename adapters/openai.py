"""OpenAI chat completions through the official SDK, with the SDK's own retries off.

Also the base of the OpenAI-compatible adapter (Ollama, OpenRouter, vLLM): those
servers sometimes answer HTTP 200 with an `error` object instead of a
completion, so the body is read raw and checked before it is trusted.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai

from adapters.base import (
    CallRequest,
    CallResult,
    ToolCall,
    arguments_text,
    finish_reason,
    json_body,
    response_text,
    token_count,
    with_rate_limits,
)
from adapters.errors import malformed, raise_error_in_body, sdk_errors
from adapters.openai_chat import chat_body
from adapters.openai_responses import RESPONSES_API, responses_body, responses_result
from adapters.token_limit import output_limit


class OpenAIAdapter:
    name = "openai"

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        # The SDK insists on a key even for servers that need none; the key is
        # handed to the client and nowhere else (never logged, never stored).
        self._client = openai.AsyncOpenAI(api_key=api_key or "not-needed", base_url=base_url, max_retries=0)

    @property
    def supports_structured_output(self) -> bool:
        return True

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        # The stored request is already the wire body (the one a provider batch line carries), so
        # it goes out through the client's generic `post`: the typed `create` would walk it
        # against the SDK's TypedDicts first, a third of the client's CPU per call,
        # and its answer is read raw anyway. Auth, headers, timeouts and the SDK's error
        # classes are the same on both paths.
        if request.api == RESPONSES_API:
            path, body, read = "/responses", responses_body(request, self.name), responses_result
        else:
            path, body, read = "/chat/completions", chat_body(request, self.name), completion_result
        with sdk_errors(openai, message=_short):
            response = await self._client.post(path, cast_to=httpx2.Response, body=body, options={"timeout": timeout})
        text = response_text(response)
        result = read(json_body(text, response.status_code), response.status_code, text)
        return with_rate_limits(result, response.headers, output_limit(body))

    async def aclose(self) -> None:
        await self._client.close()


# Chat completions' `finish_reason`, in the ledger's words (`function_call`: the legacy form).
_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}


def completion_result(data: Any, status_code: int = 200, body_text: str | None = None) -> CallResult:
    """A parsed chat completion body as a result (online answers and batch output lines alike):
    its text, tool calls, refusal, the `reasoning_content` some OpenAI-compatible servers send,
    and the usage in full; the body itself kept as received."""
    raise_error_in_body(data, status_code)
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise malformed("response has no choices[0].message", status_code) from None
    if not isinstance(message, dict) or not isinstance(choice, dict):
        raise malformed("response has no choices[0].message", status_code)
    calls = _tool_calls(message)
    refusal = message.get("refusal") if isinstance(message.get("refusal"), str) else None
    if "content" not in message and not calls and refusal is None:
        raise malformed("response has no choices[0].message.content", status_code)
    content = message.get("content")
    text = content if isinstance(content, str) else content_parts_text(content)
    thinking = message.get("reasoning_content") or message.get("reasoning")
    said = choice.get("finish_reason")
    finish = finish_reason(said, _FINISH)
    if refusal and finish in ("stop", None):
        finish = "refusal"
    usage = data.get("usage") or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return CallResult(
        text,
        token_count(usage.get("prompt_tokens")),
        token_count(usage.get("completion_tokens")),
        status_code,
        finish_reason=finish,
        provider_finish_reason=said if isinstance(said, str) else None,
        tool_calls=calls,
        refusal=refusal or None,
        thinking=thinking if isinstance(thinking, str) and thinking else None,
        cached_input_tokens=token_count(prompt_details.get("cached_tokens")),
        reasoning_tokens=token_count(completion_details.get("reasoning_tokens")),
        response=data,
        response_text=body_text,
    )


def content_parts_text(content: Any) -> str:
    """The text of a content given as a list of parts (some compatible servers answer so)."""
    if not isinstance(content, list):
        return ""
    return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def _tool_calls(message: dict[str, Any]) -> tuple[ToolCall, ...]:
    if not message.get("tool_calls") and not message.get("function_call"):
        return ()
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    found = [
        ToolCall(
            str(c.get("id") or ""),
            str(fn.get("name") or ""),
            arguments_text(fn.get("arguments", fn.get("input")) or ""),
        )
        for c in calls
        if isinstance(fn := c.get("function") or c.get("custom"), dict)
    ]
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        found.append(ToolCall("", str(legacy.get("name") or ""), arguments_text(legacy.get("arguments") or "")))
    return tuple(found)


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return f"{exc.status_code}: {error['message']}"
    return f"{exc.status_code}: {exc.message}"
