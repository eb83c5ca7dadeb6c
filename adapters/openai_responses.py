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

from typing import Any, Final

from adapters.base import (
    CallRequest,
    CallResult,
    ToolCall,
    arguments_text,
    joined,
    malformed,
    raise_error_in_body,
    token_count,
)

RESPONSES_API: Final = "responses"
ENDPOINT: Final = "/v1/responses"
# Why a response is incomplete (`incomplete_details.reason`), in the ledger's words.
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def responses_body(request: CallRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request.model, "input": request.messages, **request.params}
    if request.system:
        body["instructions"] = request.system
    if request.response_format is not None:
        body["text"] = {**(body.get("text") or {}), "format": text_format(request.response_format)}
    return body


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
    texts: list[str] = []
    refusals: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for item in data["output"]:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    refusals.append(str(part.get("refusal") or ""))
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments", item.get("input"))
            calls.append(
                ToolCall(
                    str(item.get("call_id") or item.get("id") or ""),
                    str(item.get("name") or ""),
                    arguments_text(arguments or ""),
                )
            )
        elif kind == "reasoning":
            thoughts.extend(str(s.get("text") or "") for s in item.get("summary") or [] if isinstance(s, dict))
    status = data.get("status")
    incomplete = data.get("incomplete_details") or {}
    said = incomplete.get("reason") if status == "incomplete" and isinstance(incomplete, dict) else status
    finish: str | None
    if status == "incomplete":
        finish = _INCOMPLETE.get(str(said), "other")
    elif calls:
        finish = "tool_calls"
    elif refusals and not "".join(texts):
        finish = "refusal"
    elif status == "completed":
        finish = "stop"
    else:
        finish = "other" if status else None
    usage = data.get("usage") or {}
    input_details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    return CallResult(
        "".join(texts),
        token_count(usage.get("input_tokens")),
        token_count(usage.get("output_tokens")),
        status_code,
        finish_reason=finish,
        provider_finish_reason=str(said) if said else None,
        tool_calls=tuple(calls),
        refusal=joined(refusals),
        thinking=joined(thoughts),
        cached_input_tokens=token_count(input_details.get("cached_tokens")),
        reasoning_tokens=token_count(output_details.get("reasoning_tokens")),
        response=data,
        response_text=body_text,
    )
