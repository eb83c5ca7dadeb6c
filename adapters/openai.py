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
    json_body,
    malformed,
    raise_error_in_body,
    sdk_errors,
    token_count,
    with_rate_limits,
)


def openai_messages(request: CallRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    messages.extend(request.messages)
    return messages


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
        # against the SDK's TypedDicts first, a third of the client's CPU per call (issue 9),
        # and its answer is read raw anyway. Auth, headers, timeouts and the SDK's error
        # classes are the same on both paths.
        body: dict[str, Any] = {"model": request.model, "messages": openai_messages(request), **request.params}
        if request.response_format is not None:
            body["response_format"] = request.response_format
        with sdk_errors(openai, message=_short):
            response = await self._client.post(
                "/chat/completions", cast_to=httpx2.Response, body=body, options={"timeout": timeout}
            )
        result = parse_chat_completion(response.text, response.status_code)
        return with_rate_limits(result, response.headers, body.get("max_completion_tokens") or body.get("max_tokens"))

    async def aclose(self) -> None:
        await self._client.close()


def parse_chat_completion(text: str, status_code: int = 200) -> CallResult:
    """Read a chat completion body, refusing malformed ones and 200s that carry an error."""
    return completion_result(json_body(text, status_code), status_code)


def completion_result(data: Any, status_code: int = 200) -> CallResult:
    """A parsed chat completion body as a result (online answers and batch output lines alike)."""
    raise_error_in_body(data, status_code)
    try:
        text_out = data["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise malformed("response has no choices[0].message.content", status_code) from None
    usage = data.get("usage") or {}
    return CallResult(
        text_out, token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")), status_code
    )


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return f"{exc.status_code}: {error['message']}"
    return f"{exc.status_code}: {exc.message}"
