"""Deterministic answers for the mock provider (server and in-process adapter alike).

The same prompt always gets the same answer, so tests can assert on content and
a re-run after a crash can be compared with the first run. Plain prompts get
some reasoning and a final `VERDICT: <1-5>` line (the contract the parsers
read); a JSON-schema response format gets a conforming instance.

Prompts may carry directives, `[[mock:fail=503x2]]` and the like, that the mock
server obeys; they are parsed here so both sides agree on the syntax.

Structured batching: an array whose items are objects with an
`enum` property (`criterion_id` of `ledger.parsing.evaluation_schema`) holds one
item per enum value, in enum order, when the array's minItems..maxItems allow it,
so the mock answers the whole contract. Two directives spoil such arrays so the
partial-success path can be tested (no effect on plain or `json_object` prompts):

    [[mock:omit=N]]     the last N items are left out (their dimensions go missing)
    [[mock:corrupt=N]]  the first N items are invalid: their first integer/number
                        property becomes the string "excellent"

`model_answer` gives the whole answer a wire format carries (`wire.py` writes it out), as the
providers do: a tool call when the request offers `tools` (and the last message is not a tool's
result), an answer cut off at `max_tokens` / `max_output_tokens` when that is below its length,
a refusal for `[[mock:refuse]]`, thinking when Anthropic's `thinking` (or the Responses API's
`reasoning.summary`) asks for it, reasoning tokens for reasoning models (o1, o3, o4, gpt-5), and
cached prompt tokens: OpenAI's when the system text was seen before by this server, Anthropic's
for the content up to a `cache_control` block (written the first time, read after).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any

from adapters.token_limit import output_limit

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
    """An answer before it is put in a wire format. `input_tokens` counts every input token (the
    cached ones and the cache writes among them), `output_tokens` every output token (reasoning
    and thinking among them)."""

    text: str
    input_tokens: int
    output_tokens: int
    finish: str = "stop"  # stop | length | tool_calls | refusal
    tool_calls: tuple[tuple[str, str, Any], ...] = ()  # (id, name, arguments as an object)
    refusal: str | None = None
    thinking: str | None = None
    reasoning_tokens: int = 0
    cached_tokens: int = 0  # read from a prompt cache
    cache_write_tokens: int = 0  # written to one (Anthropic's cache_control)


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


REASONING_MODELS = ("o1", "o3", "o4", "gpt-5", "gemini-2.5", "gemini-3")
REASONING_TOKENS = 64  # what a reasoning model spends thinking, in the mock: a fixed number
REFUSAL = "I can't help with that request."


def request_prompt(wire: str, payload: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """(system, messages) of a request body in a wire format: `chat` and `anthropic` name them
    so; the Responses API's are `instructions` and `input` (a string: one user message)."""
    if wire == "responses":
        given = payload.get("input", [])
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
        return payload.get("instructions"), [m for m in messages if isinstance(m, dict)]
    return payload.get("system"), payload.get("messages", [])


def max_output(payload: dict[str, Any]) -> int | None:
    asked = output_limit(payload)
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None


def model_answer(wire: str, payload: dict[str, Any], seen_prefixes: set[str] | None = None) -> MockAnswer:
    """The whole answer to a request body in `wire` (chat | responses | anthropic). `seen_prefixes`:
    the server's prompt cache (prefixes it has seen), updated here."""
    model = str(payload.get("model", "mock"))
    system, messages = request_prompt(wire, payload)
    response_format = payload.get("response_format")
    if wire == "responses":
        text_format = (payload.get("text") or {}).get("format")
        if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
            response_format = {"type": "json_schema", "json_schema": text_format}
    elif wire == "anthropic":  # Anthropic's structured output: `output_config.format`, a JSON schema
        output_format = (payload.get("output_config") or {}).get("format")
        if isinstance(output_format, dict) and output_format.get("type") == "json_schema":
            response_format = {"type": "json_schema", "json_schema": output_format}
    plain = chat_answer(model, system, messages, response_format)
    prompt = prompt_text(system, messages)
    found = directives(prompt)
    cached, written = _cache(wire, system, messages, plain.input_tokens, seen_prefixes)
    reasoning = REASONING_TOKENS if model.startswith(REASONING_MODELS) else 0
    thinking = _thinking(wire, payload, prompt)
    thought_tokens = _tokens(thinking) if thinking else 0
    base = MockAnswer(
        plain.text,
        plain.input_tokens,
        plain.output_tokens + thought_tokens + reasoning,
        thinking=thinking,
        # Gemini counts every thought, shown or not, as thinking (`thoughtsTokenCount`).
        reasoning_tokens=reasoning + (thought_tokens if wire == "gemini" else 0),
        cached_tokens=cached,
        cache_write_tokens=written,
    )
    if "refuse" in found:
        return replace(base, text="", output_tokens=_tokens(REFUSAL) + reasoning, finish="refusal", refusal=REFUSAL)
    tools = payload.get("tools")
    last = messages[-1] if messages else {}
    if tools and isinstance(tools, list) and not _is_tool_result(last):
        name, schema = _tool(tools[0])
        seed = _seed(model, prompt)
        arguments = _instance(schema, seed) if schema else {}
        call_id = f"call_{hashlib.sha256(f'{seed}'.encode()).hexdigest()[:16]}"
        out = _tokens(json.dumps(arguments)) + thought_tokens + reasoning
        return replace(base, text="", output_tokens=out, finish="tool_calls", tool_calls=((call_id, name, arguments),))
    limit = max_output(payload)
    if limit is not None and base.output_tokens > limit:
        kept = max(int((limit - thought_tokens - reasoning) * 0.75), 0)
        return replace(base, text=" ".join(plain.text.split(" ")[:kept]), output_tokens=limit, finish="length")
    return base


def _is_tool_result(message: Any) -> bool:
    if not isinstance(message, dict):
        return False
    if message.get("role") == "tool" or message.get("type") == "function_call_output":
        return True
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _tool(tool: Any) -> tuple[str, dict[str, Any] | None]:
    """A tool's name and argument schema in any of the three wire formats."""
    if not isinstance(tool, dict):
        return "tool", None
    spec: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
    schema = spec.get("parameters") or spec.get("input_schema")
    return str(spec.get("name") or "tool"), schema if isinstance(schema, dict) else None


def _thinking(wire: str, payload: dict[str, Any], prompt: str) -> str | None:
    thinking = payload.get("thinking")
    reasoning = payload.get("reasoning")
    asked = (
        (wire == "anthropic" and isinstance(thinking, dict) and thinking.get("type") == "enabled")
        or (wire == "responses" and isinstance(reasoning, dict) and reasoning.get("summary"))
        or (wire == "gemini" and payload.get("include_thoughts"))  # `gemini_wire.as_chat`'s reading
    )
    if not asked:
        return None
    seed = _seed("thinking", prompt)
    return "Let me weigh this. " + _REASONS[seed % len(_REASONS)] + ". So the answer follows."


def _cache(
    wire: str, system: Any, messages: list[dict[str, Any]], input_tokens: int, seen: set[str] | None
) -> tuple[int, int]:
    """(cached tokens read, tokens written to the cache) of a prompt."""
    if seen is None:
        return 0, 0
    if wire != "anthropic":  # OpenAI: a prompt prefix (here, the system text) seen before is cached
        instructions = content_text(system) + "".join(
            content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")
        )
        if not instructions:
            return 0, 0
        key = "openai:" + hashlib.sha256(instructions.encode()).hexdigest()
        if key in seen:
            return min(_tokens(instructions), input_tokens), 0
        seen.add(key)
        return 0, 0
    prefix: list[str] = [system] if isinstance(system, str) and system else []
    marked: str | None = None
    for part in _blocks(system) + [b for m in messages for b in _blocks(m.get("content"))]:
        prefix.append(str(part.get("text", "")))
        if part.get("cache_control"):
            marked = "\n".join(prefix)
    if marked is None:
        return 0, 0
    tokens = min(_tokens(marked), input_tokens)
    key = "anthropic:" + hashlib.sha256(marked.encode()).hexdigest()
    if key in seen:
        return tokens, 0
    seen.add(key)
    return 0, tokens


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
