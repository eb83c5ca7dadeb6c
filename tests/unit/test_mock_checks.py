"""The mock provider's request checks: the compiled schema check agrees with `jsonschema` on the
vendored OpenAI schemas, OpenAPI's words are read as OpenAI means them, and the SDK TypedDict
checks refuse unknown keys at any depth and see `Required` fields."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from anthropic.types import MessageCreateParams

from adapters.mock_provider import openai_checks, openai_spec
from adapters.mock_provider.fast_schema import Compiler
from adapters.mock_provider.typed_checks import Invalid, TypedChecks

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
CHAT_OK: list[dict[str, Any]] = [
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "gpt-4o-mini", "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}]},
    {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
        "max_completion_tokens": 10,
        "temperature": None,
        "stop": ["x"],
    },
]
CHAT_BAD: list[dict[str, Any]] = [
    {"model": "gpt-4o-mini", "messages": []},
    {"model": "gpt-4o-mini", "messages": [{"role": "tool", "content": "r"}]},
    {"model": "gpt-4o-mini", "messages": [{"role": "critic", "content": "r"}]},
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": 5}]},
    {"model": "gpt-4o-mini", "messages": [{"role": "user"}]},
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "n": "two"},
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"},
    {"messages": [{"role": "user", "content": "x"}]},
]
RESPONSES_OK: list[dict[str, Any]] = [
    {"model": "o4-mini", "input": "hi"},
    {"model": "o4-mini", "input": [{"role": "user", "content": "hi"}], "instructions": "x", "max_output_tokens": 16},
    {
        "model": "o4-mini",
        "input": [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "r"},
        ],
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low", "summary": "auto"},
    },
]
RESPONSES_BAD: list[dict[str, Any]] = [
    {"model": "o4-mini", "input": "hi", "max_output_tokens": 5},
    {"model": "o4-mini", "input": [{"type": "function_call_output", "call_id": "c"}]},
    {"model": "o4-mini", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
    {"model": "o4-mini", "input": "hi", "reasoning": {"effort": "extreme"}},
]


@pytest.mark.parametrize(
    ("name", "bodies", "valid"),
    [
        (openai_checks.CHAT, CHAT_OK, True),
        (openai_checks.CHAT, CHAT_BAD, False),
        (openai_checks.RESPONSES, RESPONSES_OK, True),
        (openai_checks.RESPONSES, RESPONSES_BAD, False),
    ],
)
def test_the_compiled_check_agrees_with_jsonschema(name: str, bodies: list[dict[str, Any]], valid: bool) -> None:
    fast = Compiler(openai_spec.definitions()).definition(name)
    slow = openai_spec.validator(name)
    for body in bodies:
        assert fast(body) is slow.is_valid(body) is valid, body


def test_every_vendored_schema_compiles() -> None:
    compiler = Compiler(openai_spec.definitions())
    for name in openai_spec.definitions():
        compiler.definition(name)  # raises Unsupported on a keyword it does not know


def test_nullable_admits_null_and_a_discriminator_picks_the_branch() -> None:
    converted = openai_spec._convert(
        {
            "oneOf": [{"$ref": "#/components/schemas/A"}, {"$ref": "#/components/schemas/B"}],
            "discriminator": {"propertyName": "kind"},
        },
        {
            "A": {"properties": {"kind": {"enum": ["a"]}, "x": {"type": "integer", "nullable": True}}},
            "B": {"properties": {"kind": {"enum": ["b"]}}, "required": ["y"]},
        },
        "Home",
    )
    picked = converted["allOf"][0]
    assert picked["then"]["properties"]["kind"] == {"enum": ["a", "b"]}
    assert picked["else"] == {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    assert openai_spec._convert({"type": "integer", "nullable": True}, {}, "H") == {"type": ["integer", "null"]}


@pytest.mark.parametrize(
    ("body", "message", "param", "code"),
    [
        (
            CHAT_BAD[0],
            "Invalid 'messages': empty array. Expected an array with minimum length 1.",
            "messages",
            "empty_array",
        ),
        (CHAT_BAD[2], "Invalid value: 'critic'.", "messages.[0].role", "invalid_value"),
        (
            CHAT_BAD[3],
            "Invalid type for 'messages[0].content': expected one of a string or an array, but got an integer",
            "messages.[0].content",
            "invalid_type",
        ),
        (CHAT_BAD[9], "Missing required parameter: 'model'.", "model", "missing_required_parameter"),
        (CHAT_BAD[5], "Invalid 'temperature': integer above maximum value.", "temperature", "integer_above_max_value"),
    ],
)
def test_a_chat_refusal_says_what_and_where_as_openai_does(
    body: dict[str, Any], message: str, param: str, code: str
) -> None:
    refusal = openai_checks.check_request(openai_checks.CHAT, body)
    assert refusal is not None and refusal.message.startswith(message), refusal
    assert (refusal.param, refusal.code) == (param, code)


def test_every_tool_call_must_be_answered_before_the_conversation_goes_on() -> None:
    body = copy.deepcopy(CHAT_OK[2])
    body["messages"].append({"role": "user", "content": "and?"})
    assert openai_checks.check_request(openai_checks.CHAT, body) is None
    del body["messages"][2]
    refusal = openai_checks.check_request(openai_checks.CHAT, body)
    assert refusal is not None and refusal.message.endswith("did not have response messages: c1")


def test_typed_checks_refuse_extra_keys_at_any_depth_and_see_required_fields() -> None:
    check = TypedChecks().check(MessageCreateParams)
    ok = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}
    check(ok)
    for bad, said in [
        ({**ok, "top_k": 5}, "top_k: Extra inputs are not permitted"),
        ({**ok, "thinking": {"type": "enabled", "budget_tokens": 1024, "x": 1}}, "thinking.x: Extra inputs"),
        ({"model": "m", "messages": ok["messages"]}, "max_tokens: Field required"),
        ({**ok, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages.0.content.0.source: Field"),
        ({**ok, "stream": True, "max_tokens": "5"}, "max_tokens: Input should be a valid integer"),
    ]:
        with pytest.raises(Invalid) as refused:
            check(bad)
        assert refused.value.said().startswith(said)
