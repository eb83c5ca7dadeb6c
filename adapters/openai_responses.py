"""OpenAI's Responses API (`POST /v1/responses`): the stored request as its body, its answer read.

The ledger stores a Responses request like any other: `instructions` as the system text, the
`input` items as messages (a plain string as one user message), a `text.format` JSON schema as
the response format (in chat's shape, so every stage reads one shape); the rest of the body
(`reasoning`, `tools`, `max_output_tokens`, ...) as params. Here it is turned back into the
body the API takes. The same body is what a provider batch line with `url: /v1/responses`
carries, so online calls (`adapters/openai.py`) and batches (`adapters/openai_batches.py`)
share these two functions.

An answer's text is its `output_text` parts joined; `function_call` items are tool calls;
reasoning summaries are thinking; `status: incomplete` for `max_output_tokens` is a cut-off
(`length`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from adapters.base import CallRequest, CallResult, ToolCall, arguments_text, joined, token_count
from adapters.errors import malformed, raise_error_in_body
from adapters.token_limit import OUTPUT_LIMIT_NAMES, output_limit, spare_limits
from adapters.translation import Untranslatable

RESPONSES_API: Final = "responses"
# `ResponseCreateParams` of the pinned openai SDK (3.57) besides model, input and instructions
# (and `stream`, which enqueue refuses when true): what the API takes.
RESPONSES_PARAMS: Final = frozenset(
    {
        "access_programs",
        "background",
        "background_options",
        "context_management",
        "conversation",
        "image",
        "include",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "moderation",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    }
)
ENDPOINT: Final = "/v1/responses"
# Why a response is incomplete (`incomplete_details.reason`), in the ledger's words.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def responses_body(request: CallRequest, provider: str = "openai", dropped: list[str] | None = None) -> dict[str, Any]:
    """The Responses API body of a stored request (online calls and batch lines alike); OpenAI and
    Azure get only the parameters its `ResponseCreateParams` has, the output limit as
    `max_output_tokens` (`dropped` collects the names of what is left out)."""
    body: dict[str, Any] = {"model": request.model, "input": request.messages}
    known_only = provider in ("openai", "azure")
    params = request.params
    for name, value in params.items():
        if name in OUTPUT_LIMIT_NAMES:
            continue
        if not known_only or name in RESPONSES_PARAMS:
            body[name] = value
        elif dropped is not None:
            dropped.append(name)
    limit = output_limit(params)
    if limit is not None:
        body["max_output_tokens"] = limit
        if dropped is not None:
            dropped.extend(spare_limits(params))
    if request.system:
        body["instructions"] = request.system
    if request.response_format is not None:
        body["text"] = {**(body.get("text") or {}), "format": text_format(request.response_format)}
    return body


def check(request: CallRequest, provider: str = "openai") -> list[str]:
    """What enqueue asks: the parameters left out of the request's body; `Untranslatable` for a chat
    message the Responses API has no such form of (its tool calls and results are typed items)."""
    for i, message in enumerate(request.messages):
        if message.get("role") == "tool" or "tool_calls" in message:
            where = f"messages[{i}].{'tool_calls' if 'tool_calls' in message else 'role'}"
            raise Untranslatable(
                where, provider, "takes tool calls and results as function_call items in api 'responses'"
            )
    limit = output_limit(request.params)
    if isinstance(limit, int) and limit < MIN_OUTPUT_TOKENS:
        name = next(n for n in OUTPUT_LIMIT_NAMES if request.params.get(n) == limit)
        raise Untranslatable(
            f"params.{name}", provider, f"api 'responses' takes at least {MIN_OUTPUT_TOKENS} output tokens, got {limit}"
        )
    dropped: list[str] = []
    responses_body(request, provider, dropped)
    return dropped


# The Responses API refuses a smaller `max_output_tokens` (OpenAI's spec: `minimum: 16`).
MIN_OUTPUT_TOKENS: Final = 16


# Body keys of a Responses line that are not parameters (`stream` and `background` stay: enqueue
# refuses a true one; `metadata` is kept as the request's trace).
_NOT_PARAMS = frozenset({"model", "input", "instructions", "metadata"})


def line_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses API body's request fields: a string input is one user message, `instructions`
    the system, a JSON schema in `text.format` the response format (chat's shape); the rest of the
    body the parameters."""
    if "input" not in body:
        raise ValueError("missing 'input'")
    given = body["input"]
    if isinstance(given, str):
        messages: Any = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        messages = given
    else:
        raise ValueError("input must be a string or a list of input items")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ValueError("instructions must be a string")
    params = {k: v for k, v in body.items() if k not in _NOT_PARAMS}
    response_format = None
    text = params.get("text")
    if isinstance(text, dict):
        response_format = chat_response_format(text.get("format"))
        if response_format is not None:
            rest = {k: v for k, v in text.items() if k != "format"}
            if rest:
                params["text"] = rest
            else:
                del params["text"]
    return {
        "messages": messages,
        "system": instructions or None,
        "params": params,
        "response_format": response_format,
        "api": RESPONSES_API,
    }


def text_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """A chat `response_format` as the Responses API's `text.format`."""
    kind = response_format.get("type")
    if kind == "json_schema" and isinstance(response_format.get("json_schema"), dict):
        return {"type": "json_schema", **response_format["json_schema"]}
    if kind in ("json_object", "text"):
        return {"type": kind}
    return {"type": "json_schema", "name": "answer", "schema": response_format}


def chat_response_format(text_format_: Any) -> dict[str, Any] | None:
    """A Responses `text.format` JSON schema in chat's `response_format` shape (what the ledger
    stores); None for any other format (it stays in the params as sent)."""
    if not isinstance(text_format_, dict) or text_format_.get("type") != "json_schema":
        return None
    return {"type": "json_schema", "json_schema": {k: v for k, v in text_format_.items() if k != "type"}}


def responses_result(data: Any, status_code: int = 200, body_text: str | None = None) -> CallResult:
    """A Responses API body as a result (online answers and batch output lines alike)."""
    raise_error_in_body(data, status_code)
    if not isinstance(data, dict) or not isinstance(data.get("output"), list):
        raise malformed("response has no output list", status_code)
    said = _output_said(data["output"])
    finish, provider_finish = _finish(data, said)
    usage = data.get("usage") or {}
    input_details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    return CallResult(
        "".join(said.texts),
        token_count(usage.get("input_tokens")),
        token_count(usage.get("output_tokens")),
        status_code,
        finish_reason=finish,
        provider_finish_reason=provider_finish,
        tool_calls=tuple(said.calls),
        refusal=joined(said.refusals),
        thinking=joined(said.thoughts),
        cached_input_tokens=token_count(input_details.get("cached_tokens")),
        reasoning_tokens=token_count(output_details.get("reasoning_tokens")),
        response=data,
        response_text=body_text,
    )


@dataclass
class _OutputSaid:
    """What an answer's output items say, by kind."""

    texts: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)


def _output_said(output: list[Any]) -> _OutputSaid:
    """A message's `output_text` and `refusal` parts, function and custom tool calls, and the
    reasoning items' summaries."""
    said = _OutputSaid()
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text":
                    said.texts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    said.refusals.append(str(part.get("refusal") or ""))
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments", item.get("input"))
            said.calls.append(
                ToolCall(
                    str(item.get("call_id") or item.get("id") or ""),
                    str(item.get("name") or ""),
                    arguments_text(arguments or ""),
                )
            )
        elif kind == "reasoning":
            said.thoughts.extend(str(s.get("text") or "") for s in item.get("summary") or [] if isinstance(s, dict))
    return said


def _finish(data: dict[str, Any], said: _OutputSaid) -> tuple[str | None, str | None]:
    """(why the answer ended in the ledger's words, the provider's own word): its `status`, or
    for an incomplete one the reason it gives."""
    status = data.get("status")
    incomplete = data.get("incomplete_details") or {}
    word = incomplete.get("reason") if status == "incomplete" and isinstance(incomplete, dict) else status
    finish: str | None
    if status == "incomplete":
        finish = _INCOMPLETE.get(str(word), "other")
    elif said.calls:
        finish = "tool_calls"
    elif said.refusals and not "".join(said.texts):
        finish = "refusal"
    elif status == "completed":
        finish = "stop"
    else:
        finish = "other" if status else None
    return finish, str(word) if word else None
