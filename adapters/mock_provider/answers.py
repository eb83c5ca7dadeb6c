"""Deterministic answers for the mock provider (server and in-process adapter alike).

The same prompt always gets the same answer, so tests can assert on content and
a re-run after a crash can be compared with the first run. Plain prompts get
some reasoning and a final `VERDICT: <1-5>` line (the contract the parsers
read); a JSON-schema response format gets a conforming instance.

Prompts may carry directives, `[[mock:fail=503x2]]` and the like, that the mock
server obeys; they are parsed here so both sides agree on the syntax.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

DIRECTIVE = re.compile(r"\[\[mock:([a-z_0-9]+)(?:=([^\]]*))?\]\]")

_REASONS = (
    "The submission addresses the criterion directly",
    "The evidence offered is partly convincing",
    "Several claims lack support from the cited material",
    "The structure makes the argument easy to follow",
    "Counter-arguments are acknowledged but not fully answered",
    "The conclusion follows from the premises presented",
)


@dataclass(frozen=True)
class MockAnswer:
    text: str
    input_tokens: int
    output_tokens: int


def content_text(content: Any) -> str:
    """Text of a message content: a string or a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def prompt_text(system: Any, messages: list[dict[str, Any]]) -> str:
    parts = [content_text(system)] if system else []
    parts.extend(content_text(m.get("content")) for m in messages)
    return "\n".join(parts)


def prompt_key(system: Any, messages: list[dict[str, Any]]) -> str:
    """Stable key for counting calls per prompt (system text + last user message)."""
    last_user = next((content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    digest = hashlib.sha256(f"{content_text(system)}\x00{last_user}".encode()).hexdigest()
    return digest[:16]


def directives(text: str) -> dict[str, str]:
    """`[[mock:name=value]]` directives found in a prompt (`[[mock:quota]]` gives value "")."""
    return {name: value or "" for name, value in DIRECTIVE.findall(text)}


def _tokens(text: str) -> int:
    return max(1, round(len(text.split()) / 0.75))


def chat_answer(
    model: str, system: Any, messages: list[dict[str, Any]], response_format: dict[str, Any] | None
) -> MockAnswer:
    prompt = prompt_text(system, messages)
    seed = int(hashlib.sha256(f"{model}\x00{prompt}".encode()).hexdigest(), 16)
    schema = _schema_of(response_format)
    if schema is not None:
        text = json.dumps(_instance(schema, seed))
    elif response_format and response_format.get("type") == "json_object":
        text = json.dumps({"answer": _REASONS[seed % len(_REASONS)], "score": seed % 5 + 1})
    else:
        reasons = [_REASONS[(seed >> (4 * i)) % len(_REASONS)] for i in range(3)]
        text = ". ".join(reasons) + ".\nWeighing these points together.\nVERDICT: " + str(seed % 5 + 1)
    return MockAnswer(text, _tokens(prompt), _tokens(text))


def _schema_of(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not response_format:
        return None
    if response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema", {}).get("schema")
        return schema if isinstance(schema, dict) else {"type": "object"}
    if "properties" in response_format or response_format.get("type") in ("object", "array"):
        return response_format
    return None


def _instance(schema: dict[str, Any], seed: int, depth: int = 0) -> Any:
    """A deterministic value that conforms to the (common subset of) JSON Schema."""
    if "enum" in schema:
        return schema["enum"][seed % len(schema["enum"])]
    if "const" in schema:
        return schema["const"]
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            return _instance(schema[combinator][0], seed, depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        return {name: _instance(sub, seed >> (i + 1), depth + 1) for i, (name, sub) in enumerate(props.items())}
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        item = schema.get("items", {"type": "string"})
        return [_instance(item, seed >> (i + 3), depth + 1) for i in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        high = schema.get("maximum", low + 4)
        value = low + seed % (int(high - low) + 1)
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return bool(seed % 2)
    if kind == "null":
        return None
    return _REASONS[seed % len(_REASONS)]
