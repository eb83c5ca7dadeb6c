"""What OpenAI refuses, checked the way OpenAI checks it: a request body against its schema in
OpenAI's published spec (`openai_spec.py`), arguments the spec does not name, and the rules the
server adds to the schema (a tool result answers a tool call before it; every tool call is
answered). A refusal carries OpenAI's error fields (`message`, `param`, `code`); `wire.py` puts
them in OpenAI's error body, `batches.py` in a batch's error lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from jsonschema.exceptions import ValidationError, best_match

from adapters.mock_provider import openai_spec
from adapters.mock_provider.fast_schema import Check, Compiler, Unsupported

# The schema of a request body, by the API path it is posted to.
CHAT = "CreateChatCompletionRequest"
RESPONSES = "CreateResponse"
_JSON_TYPES = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
}


@dataclass(frozen=True)
class Refusal:
    """Why a provider refuses a request, in its own words: `message`, and for OpenAI the
    parameter (`param`, e.g. `messages.[2].tool_call_id`) and `code` its error names."""

    message: str
    param: str | None = None
    code: str | None = None


@cache
def _fast(name: str) -> Check | None:
    try:
        return Compiler(openai_spec.definitions()).definition(name)
    except Unsupported:
        return None


def warm() -> None:
    """Compile the request checks now (a first request should not pay for it)."""
    for name in (CHAT, RESPONSES, "BatchRequestInput", "CreateBatchRequest"):
        _fast(name)
        openai_spec.validator(name)
        openai_spec.top_level_fields(name)


def check_request(name: str, body: Any) -> Refusal | None:
    """None when OpenAI takes `body` as a request of schema `name`; else its refusal."""
    if not isinstance(body, dict):
        return Refusal("We could not parse the JSON body of your request: it must be a JSON object.")
    known = openai_spec.top_level_fields(name)
    for key in body:
        if key not in known:
            return Refusal(f"Unrecognized request argument supplied: {key}")
    fast = _fast(name)
    if fast is None or not fast(body):
        error = best_match(openai_spec.validator(name).iter_errors(body))
        if error is not None:
            return _refusal(error, body)
    if name == CHAT:
        return _tool_links(body["messages"])
    if name == RESPONSES:
        return _call_outputs(body.get("input"))
    return None


def _where(path: list[str | int]) -> tuple[str, str]:
    """A place in the body as OpenAI's messages write it (`messages[2].content`) and as its
    `param` field does (`messages.[2].content`)."""
    said = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    param = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path)
    return said, param


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _refusal(error: ValidationError, body: dict[str, Any]) -> Refusal:
    """OpenAI's error for the schema violation `jsonschema` found most relevant."""
    path = list(error.absolute_path)
    said, param = _where(path)
    if error.validator == "required":
        missing = str(error.message).split("'")[1]
        if missing == "tool_call_id":
            message = "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'."
            return Refusal(message, _where([*path, missing])[1], None)
        full, full_param = _where([*path, missing])
        return Refusal(f"Missing required parameter: '{full}'.", full_param, "missing_required_parameter")
    kinds = _expected_kinds(error)
    if kinds:
        expected = " or ".join(_JSON_TYPES.get(k, k) for k in kinds)
        expected = f"one of {expected}" if len(kinds) > 1 else expected
        message = f"Invalid type for '{said}': expected {expected}, but got {_kind(error.instance)} instead."
        return Refusal(message, param, "invalid_type")
    if error.validator in ("enum", "const"):
        named: Any = error.validator_value
        allowed: list[Any] = list(named) if error.validator == "enum" else [named]
        listed = ", ".join(repr(a) for a in allowed)
        return Refusal(f"Invalid value: {error.instance!r}. Supported values are: {listed}.", param, "invalid_value")
    if error.validator in ("minimum", "maximum") and isinstance(error.instance, (int, float)):
        below = error.validator == "minimum"
        kind = "integer" if isinstance(error.instance, int) else "decimal"
        bound = f"{'>=' if below else '<='} {error.validator_value}"
        message = (
            f"Invalid '{said}': {kind} {'below minimum' if below else 'above maximum'} value."
            f" Expected a value {bound}, but got {error.instance} instead."
        )
        return Refusal(message, param, f"{kind}_{'below_min' if below else 'above_max'}_value")
    if error.validator == "minItems" and error.instance == []:
        message = f"Invalid '{said}': empty array. Expected an array with minimum length {error.validator_value}."
        return Refusal(message, param, "empty_array")
    return Refusal(f"Invalid '{said}': {error.message}.", param, "invalid_value")


def _expected_kinds(error: ValidationError) -> list[str]:
    """The JSON types a value should have been, when the error is only that: a `type` error, or
    a union each of whose branches wanted another type."""
    if error.validator == "type":
        named: Any = error.validator_value
        return [str(k) for k in (named if isinstance(named, list) else [named])]
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return []
    kinds: list[str] = []
    for branch in error.context:
        if branch.validator != "type" or branch.relative_path:
            return []
        named = branch.validator_value
        kinds.extend(str(k) for k in (named if isinstance(named, list) else [named]) if str(k) not in kinds)
    return kinds


def _tool_links(messages: list[dict[str, Any]]) -> Refusal | None:
    """A `tool` message answers a tool call of the assistant message before it, and every such
    call is answered before the conversation goes on (OpenAI's own words for each)."""
    open_calls: dict[str, int] = {}  # call id -> the assistant message that made it
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return Refusal(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message"
                    " with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            del open_calls[message["tool_call_id"]]
            continue
        if open_calls:
            return _unanswered(open_calls)
        if role == "assistant":
            open_calls = {str(c.get("id")): i for c in message.get("tool_calls") or [] if isinstance(c, dict)}
    return _unanswered(open_calls) if open_calls else None


def _unanswered(open_calls: dict[str, int]) -> Refusal:
    at = next(iter(open_calls.values()))
    ids = ", ".join(open_calls)
    return Refusal(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
        f" 'tool_call_id'. The following tool_call_ids did not have response messages: {ids}",
        f"messages.[{at}].role",
    )


def _call_outputs(given: Any) -> Refusal | None:
    """A Responses API `function_call_output` answers a `function_call` given before it."""
    if not isinstance(given, list):
        return None
    calls: set[str] = set()
    for item in given:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.add(str(item.get("call_id")))
        elif item.get("type") == "function_call_output" and str(item.get("call_id")) not in calls:
            return Refusal(f"No tool call found for function call output with call_id {item.get('call_id')}.", "input")
    return None
