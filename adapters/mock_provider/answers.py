"""Deterministic answers for the mock provider (server and in-process adapter alike).

The same prompt always gets the same answer, so tests can assert on content and
a re-run after a crash can be compared with the first run. Plain prompts get
some reasoning and a final `VERDICT: <1-5>` line (the contract the parsers
read); a JSON-schema response format gets a conforming instance.

Prompts may carry directives, `[[mock:fail=503x2]]` and the like, that the mock
server obeys; they are parsed here so both sides agree on the syntax.

Structured batching (seed 000 FR-005): an array whose items are objects with an
`enum` property (`criterion_id` of `ledger.parsing.evaluation_schema`) holds one
item per enum value, in enum order, when the array's minItems..maxItems allow it,
so the mock answers the whole contract. Two directives spoil such arrays so the
partial-success path can be tested (no effect on plain or `json_object` prompts):

    [[mock:omit=N]]     the last N items are left out (their dimensions go missing)
    [[mock:corrupt=N]]  the first N items are invalid: their first integer/number
                        property becomes the string "excellent"
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


def _seed(model: str, prompt: str) -> int:
    return int(hashlib.sha256(f"{model}\x00{prompt}".encode()).hexdigest(), 16)


def mock_verdict(model: str, system: Any, messages: list[dict[str, Any]]) -> int:
    """The score of the final `VERDICT:` line a plain prompt gets, for tests to expect."""
    return _seed(model, prompt_text(system, messages)) % 5 + 1


@dataclass(frozen=True)
class _Spoil:
    """What the `omit` / `corrupt` directives do to an enum-covering array."""

    omit: int = 0
    corrupt: int = 0


def _count(found: dict[str, str], name: str) -> int:
    try:
        return max(int(found.get(name, "0") or 0), 0)
    except ValueError:
        return 0


def chat_answer(
    model: str, system: Any, messages: list[dict[str, Any]], response_format: dict[str, Any] | None
) -> MockAnswer:
    prompt = prompt_text(system, messages)
    seed = _seed(model, prompt)
    schema = _schema_of(response_format)
    if schema is not None:
        found = directives(prompt)
        text = json.dumps(_instance(schema, seed, spoil=_Spoil(_count(found, "omit"), _count(found, "corrupt"))))
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


def _instance(schema: dict[str, Any], seed: int, depth: int = 0, spoil: _Spoil = _Spoil()) -> Any:
    """A deterministic value that conforms to the (common subset of) JSON Schema."""
    if "enum" in schema:
        return schema["enum"][seed % len(schema["enum"])]
    if "const" in schema:
        return schema["const"]
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            return _instance(schema[combinator][0], seed, depth + 1, spoil)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        return {name: _instance(sub, seed >> (i + 1), depth + 1, spoil) for i, (name, sub) in enumerate(props.items())}
    if kind == "array":
        item = schema.get("items", {"type": "string"})
        covering = _enum_covering(schema, item)
        if covering is not None:
            return _covering_items(item, covering, seed, depth, spoil)
        count = max(int(schema.get("minItems", 1)), 1)
        return [_instance(item, seed >> (i + 3), depth + 1, spoil) for i in range(count)]
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


def _enum_covering(array: dict[str, Any], item: dict[str, Any]) -> str | None:
    """The enum property that gets one array item per value, if the item count allows it."""
    props: dict[str, Any] = item.get("properties", {}) if item.get("type", "object") == "object" else {}
    name = next((n for n, sub in props.items() if isinstance(sub, dict) and sub.get("enum")), None)
    if name is None:
        return None
    size = len(props[name]["enum"])
    fits = int(array.get("minItems", 0)) <= size <= int(array.get("maxItems", size))
    return name if fits else None


def _covering_items(item: dict[str, Any], name: str, seed: int, depth: int, spoil: _Spoil) -> list[Any]:
    """One item per enum value, in enum order; then the `corrupt` and `omit` directives."""
    items = [
        _instance(item, seed >> (i + 3), depth + 1, spoil) | {name: value}
        for i, value in enumerate(item["properties"][name]["enum"])
    ]
    numeric = next(
        (
            n
            for n, sub in item["properties"].items()
            if isinstance(sub, dict) and sub.get("type") in ("integer", "number")
        ),
        None,
    )
    for entry in items[: spoil.corrupt]:
        if numeric is not None:
            entry[numeric] = "excellent"
        else:
            entry[name] = None
    return items[: len(items) - spoil.omit] if spoil.omit else items
