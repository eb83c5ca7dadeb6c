"""The one small interface between the ledger and a provider.

Like httpx's transport seam: the ledger hands an adapter a provider-neutral
request and gets back text and usage, or a `ProviderError` that already says
whether a retry can help. Everything a provider does differently (wire format,
where the system prompt goes, which errors are transient) stays behind it.

Here: the call (`CallRequest`, `CallResult`, `Adapter`) and the helpers every adapter
reads an answer's fields with. Beside it: `errors` (`ProviderError` and the retry rules),
`rate_limits` (the headers that pace a pool), `batch_interface` (provider batch jobs) and
`json_lines` (a batch's files, read and written line by line).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from adapters.errors import malformed
from adapters.rate_limits import RateLimits, read_rate_limits


@dataclass(frozen=True)
class CallRequest:
    """A request as stored in the ledger: system, messages, params, response format. Messages
    and their parts are as the caller wrote them (OpenAI's, Anthropic's or Gemini's words); the
    system is text, or Anthropic's system blocks as given."""

    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    api: str | None = None  # chat | responses | messages; None: the provider's usual one


# Why an answer ended, in the ledger's words (each adapter maps its provider's own word here,
# and keeps that word as `provider_finish_reason`).
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "refusal", "other")


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for: `arguments` is the exact JSON text it produced (Anthropic's
    `tool_use` input, which arrives as an object, serialised with sorted keys)."""

    id: str
    name: str
    arguments: str

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(slots=True)  # not frozen: built per mapped line, and a frozen __init__ costs three times as much
class CallResult:
    """One answer, whole: its text (`raw_output`: text blocks joined, "" for an answer that is
    only a tool call), the provider-neutral fields derived from its body, the usage in full, and
    the body itself as received (`response`, the parsed JSON, never changed).

    `input_tokens` is every input token the model read (cached ones and cache writes included);
    `cached_input_tokens` and `cache_write_tokens` are the parts of it billed at other rates;
    `reasoning_tokens` the part of `output_tokens` spent thinking."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    status_code: int = 200
    limits: RateLimits | None = None  # the provider's rate-limit headers, when it sent any
    finish_reason: str | None = None  # one of FINISH_REASONS
    provider_finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    refusal: str | None = None
    thinking: str | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    response: Any = None
    response_text: str | None = None  # the body's JSON text exactly as received, where the adapter has it
    # The price table entry that prices this answer, when it is not the request's own provider and
    # model: Azure's model is a deployment name of the user's, its answer names the real model.
    priced_as: tuple[str, str] | None = None


class Adapter(Protocol):
    """What the executor needs from a provider."""

    name: str

    @property
    def supports_structured_output(self) -> bool: ...

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        """Make one attempt. Raise `ProviderError` on failure; never retry internally."""
        ...

    async def aclose(self) -> None: ...


def tokens_counted(result: CallResult, max_tokens: Any) -> tuple[int, int] | None:
    """(input, output) tokens a provider counts against its token windows for an answered call.
    Both estimate a call when they admit it from its prompt and the `max_tokens` it asks for
    (Anthropic's documentation says it adjusts the output part to the usage afterwards), so
    that is what the next call must find room for; a request without `max_tokens` is counted
    by its usage. None when the answer reported no usage."""
    if result.input_tokens is None and result.output_tokens is None:
        return None
    asked = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
    return result.input_tokens or 0, max_tokens if asked else (result.output_tokens or 0)


def with_rate_limits(result: CallResult, headers: Any, max_tokens: Any) -> CallResult:
    """An answer with its rate-limit headers and what the provider counted for it against its
    token windows (`tokens_counted`, from the `max_tokens` the request sent); the answer as it
    is when it came with no such headers."""
    limits = read_rate_limits(headers)
    if limits is None:
        return result
    return replace(result, limits=replace(limits, call_tokens=tokens_counted(result, max_tokens)))


def finish_reason(word: Any, table: dict[str, str]) -> str | None:
    """A provider's word for why an answer ended, in the ledger's (`FINISH_REASONS`): from the
    adapter's `table`, "other" for a word it does not know, None when the provider said none."""
    if not isinstance(word, str) or not word:
        return None
    return table.get(word, "other")


def arguments_text(value: Any) -> str:
    """A tool call's arguments as JSON text: as the model wrote them when they came as text (an
    OpenAI function call), else the object serialised with sorted keys (Anthropic's `input`)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def joined(parts: list[str]) -> str | None:
    """Text pieces of one kind (thinking blocks, refusals) as one text; None when there are none."""
    found = [part for part in parts if part]
    return "\n\n".join(found) if found else None


def token_count(value: Any) -> int | None:
    """A usage count as a provider sent it, as a whole number: some OpenAI-compatible servers
    send `12.0`, which PostgreSQL's integer columns refuse; anything not a number is unknown."""
    if type(value) is int:  # the usual case, first: a batch's results read four of these a line
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(value)


def response_text(response: Any) -> str:
    """An httpx response's body as text, as `response.text` decodes it: UTF-8 (JSON's encoding)
    where its Content-Type names no charset, decoded here without `text`'s parse of that header
    (through `email.message`: 20 us an answer, two fifths of the adapter's own time)."""
    content_type = response.headers.get("content-type")
    if content_type is None or ";" not in content_type:
        return str(response.content.decode("utf-8", "replace"))
    return str(response.text)


def json_body(text: str, status_code: int) -> Any:
    """An answer's body as JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise malformed(f"malformed response body ({len(text)} bytes, not JSON)", status_code) from None
