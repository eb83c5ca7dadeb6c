"""Which provider's format a JSONL input line is in, and the request it asks for.

`ledger enqueue` takes the providers' own batch-input lines and bare request bodies:

- OpenAI's Batch API line, `{"custom_id", "method", "url", "body"}`: its `url` names the API
  (`/v1/chat/completions`, `/v1/responses`, or `/v1/messages` for an Anthropic body);
- Anthropic's Message Batches entry, `{"custom_id", "params"}`;
- Gemini's Batch line, `{"key", "request"}` (a `GenerateContentRequest`);
- a bare body: chat's (`messages`) or the Responses API's (`input`).

Each body is read by the module of its own API (`openai_chat`, `openai_responses`,
`anthropic_format`, `gemini_format`); the ledger gets the request's fields in its own names.
A line that is none of these is a `ValueError` naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from adapters import anthropic_format, gemini_format, openai_chat, openai_responses


@dataclass(frozen=True)
class LineRequest:
    """A line's request: `fields` in the ledger's names (messages, system, params,
    response_format, trace, and model and api when the line names them); `provider` the one
    its format is for (None: OpenAI's formats, which every provider reads)."""

    fields: dict[str, Any]
    provider: str | None = None


def custom_id_of(obj: dict[str, Any]) -> Any:
    """The line's own key: `custom_id`, or a Gemini line's `key`."""
    return obj.get("key") if _gemini_line(obj) else obj.get("custom_id")


def _gemini_line(obj: dict[str, Any]) -> bool:
    return isinstance(obj.get("request"), dict) and "key" in obj


def read_line(obj: dict[str, Any], not_the_providers: Collection[str]) -> LineRequest:
    """The request of one line (`not_the_providers`: a bare body's keys that are the ledger's)."""
    if _gemini_line(obj):
        fields = gemini_format.ledger_fields(obj["request"])
        if obj.get("model"):
            fields["model"] = obj["model"]
        return LineRequest(fields, "gemini")
    provider = api = None
    if "body" in obj:  # OpenAI Batch input line
        body = obj["body"]
        url = str(obj.get("url", openai_chat.ENDPOINT)).rstrip("/")
        if url.endswith("/messages"):
            provider = "anthropic"
        elif url.endswith("/responses"):
            api = openai_responses.RESPONSES_API
        elif not url.endswith("/chat/completions"):
            raise ValueError(
                f"url {url!r} is not a model endpoint (/v1/chat/completions, /v1/responses or /v1/messages)"
            )
    elif "params" in obj and obj.get("custom_id") is not None:  # Anthropic Message Batches entry
        body, provider = obj["params"], "anthropic"
    else:  # a bare request body: chat's (`messages`) or the Responses API's (`input`)
        body = {k: v for k, v in obj.items() if k not in not_the_providers}
        if "input" in body and "messages" not in body:
            api = openai_responses.RESPONSES_API
    if not isinstance(body, dict):
        raise ValueError("request body is not a JSON object")
    if api is not None:
        fields = openai_responses.line_fields(body)
    elif provider == "anthropic":
        fields = anthropic_format.line_fields(body)
    else:
        fields = openai_chat.line_fields(body)
    if isinstance(body.get("model"), str):
        fields["model"] = body["model"]
    if isinstance(body.get("metadata"), dict):  # the caller's labels: kept as the request's trace
        fields["trace"] = body["metadata"]
    return LineRequest(fields, provider)
