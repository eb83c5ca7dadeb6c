"""A request read from any provider's line and written for any provider: the same conversation,
tools, tool choice, structured output and system prompt in each API's own words; the same request
when read and written for one provider; what a target cannot say refused with one line; the
parameters a target's API lacks left out and named. Pure: no database, no network."""

from __future__ import annotations

import copy
import json
import typing
from collections.abc import Callable
from typing import Any

import pytest

from adapters.anthropic_format import MESSAGES_PARAMS, messages_body
from adapters.base import CallRequest
from adapters.gemini_format import wire_request
from adapters.openai_chat import CHAT_PARAMS, chat_body
from adapters.openai_responses import RESPONSES_PARAMS, responses_body
from ledger.enqueue import Defaults, EnqueueError, build_spec, checked_row, spec_from_line
from ledger.executor import stored_call

SCHEMA = {"type": "object", "properties": {"warmer": {"type": "string"}}, "required": ["warmer"]}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SYSTEM = "You answer questions about the weather."

# One conversation (user -> assistant with two tool calls and no text -> two tool results -> user),
# with a function tool, tool choice "auto", a JSON schema answer and a system prompt, in the words
# of each API.
CHAT = {
    "model": "m",
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21C"},
        {"role": "user", "content": "Which is warmer?"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER},
        }
    ],
    "tool_choice": "auto",
    "response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": SCHEMA}},
    "max_completion_tokens": 300,
}
ANTHROPIC = {
    "model": "m",
    "system": SYSTEM,
    "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "21C"},
                {"type": "text", "text": "Which is warmer?"},
            ],
        },
    ],
    "tools": [{"name": "get_weather", "description": "Current weather", "input_schema": WEATHER}],
    "tool_choice": {"type": "auto"},
    "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
    "max_tokens": 300,
}
GEMINI = {
    "systemInstruction": {"parts": [{"text": SYSTEM}]},
    "contents": [
        {"role": "user", "parts": [{"text": "Weather in Paris and Rome?"}]},
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}},
                {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}, "id": "call_2"}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"result": "18C"}, "id": "call_1"}},
                {"functionResponse": {"name": "get_weather", "response": {"result": "21C"}, "id": "call_2"}},
                {"text": "Which is warmer?"},
            ],
        },
    ],
    "tools": [
        {
            "functionDeclarations": [
                {"name": "get_weather", "description": "Current weather", "parametersJsonSchema": WEATHER}
            ]
        }
    ],
    "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    "generationConfig": {"maxOutputTokens": 300, "responseMimeType": "application/json", "responseJsonSchema": SCHEMA},
}

LINES: dict[str, dict[str, Any]] = {
    "openai": {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": CHAT},
    "anthropic": {"custom_id": "c", "params": ANTHROPIC},
    "gemini": {"key": "c", "model": "m", "request": GEMINI},
}
WRITERS: dict[str, Callable[[CallRequest], dict[str, Any]]] = {
    "openai": chat_body,
    "anthropic": messages_body,
    "gemini": wire_request,
}
EXPECTED = {"openai": CHAT, "anthropic": ANTHROPIC, "gemini": GEMINI}


def stored(line: dict[str, Any], provider: str | None = None) -> tuple[CallRequest, dict[str, Any]]:
    """A line as the ledger stores it (enqueue's own checks included), and as an adapter gets it."""
    spec = spec_from_line(copy.deepcopy(line), Defaults(provider=provider))
    row, _ = checked_row(spec)
    return stored_call(row["model"], row["input"], row["params"], row["response_format"], row["api"]), row


@pytest.mark.parametrize("target", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("source", ["openai", "anthropic", "gemini"])
def test_a_tool_conversation_with_a_schema_and_a_system_prompt_reads_the_same_in_every_api(
    source: str, target: str
) -> None:
    call, row = stored(LINES[source], provider=target)
    assert row["dropped_params"] is None
    assert WRITERS[target](call) == EXPECTED[target] | ({"model": "m"} if target != "gemini" else {})


def test_an_openai_chat_line_is_stored_as_given_and_written_back_the_same() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "system", "content": [{"type": "text", "text": "Second system part."}]},
            {
                "role": "user",
                "name": "alice",
                "content": [
                    {"type": "text", "text": "What is in these?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{ "at" : "a" }'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "look", "content": "a cat"},
            {"role": "user", "content": "And?"},
        ],
        "temperature": 0.2,
        "seed": 7,
        "parallel_tool_calls": False,
        "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "look"}},
        "max_completion_tokens": 50,
    }
    call, row = stored({"custom_id": "x", "url": "/v1/chat/completions", "body": body})
    assert row["input"]["messages"] == body["messages"]  # everything the line says, kept
    assert chat_body(call) == body
    assert row["dropped_params"] is None


def test_a_responses_line_is_written_back_the_same() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "3C"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}],
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}},
        "max_output_tokens": 100,
    }
    call, row = stored({"custom_id": "r", "url": "/v1/responses", "body": body})
    assert responses_body(call) == body
    assert row["dropped_params"] is None


def test_an_anthropic_line_keeps_its_system_blocks_cache_marks_and_blocks() -> None:
    body = {
        "model": "claude-haiku-4-5",
        "system": [
            {"type": "text", "text": "Long shared context.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Answer briefly."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                ],
            },
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "zoom", "input": {"x": 1}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "big"}]}],
            },
        ],
        "tools": [{"name": "zoom", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "tool_choice": {"type": "tool", "name": "zoom", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stop_sequences": ["END"],
        "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": SCHEMA}},
        "max_tokens": 2048,
    }
    call, row = stored({"custom_id": "a", "params": body})
    assert row["input"] == {"system": body["system"], "messages": body["messages"]}
    assert messages_body(call) == body
    assert row["dropped_params"] is None


def test_a_gemini_line_with_function_parts_is_written_back_the_same() -> None:
    request = copy.deepcopy(GEMINI)
    request["generationConfig"] |= {"temperature": 0.5, "thinkingConfig": {"thinkingBudget": 128}}
    request["safetySettings"] = [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]
    call, _ = stored({"key": "g", "model": "gemini-2.5-flash", "request": request})
    assert wire_request(call) == request


def test_a_plain_text_request_keeps_the_keys_it_had_before_messages_were_kept_whole() -> None:
    spec = spec_from_line(
        {"model": "m", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]}, Defaults()
    )
    row, _ = checked_row(spec)
    # The system text stored apart, as always: the keys an unchanged file had (the values the
    # ledger computed before messages were kept whole) stay.
    assert row["input"] == {"system": "S", "messages": [{"role": "user", "content": "Q"}]}
    assert row["idempotency_key"] == "sha256:dfce7ac020be39e6e3ad3282c1e323ca6d6b330a"
    assert row["body_hash"] == "6c4548aba167a19677404e88da0ab2c316375ec36fbe3b1f406a65136ef27d56"
    assert row["cache_key"] == "ec50d78e35994dcb979055e345779a259e500e4b1e53c5289e372b1989722a9c"


@pytest.mark.parametrize(
    ("provider", "params", "dropped", "sent"),
    [
        (
            "anthropic",
            {"temperature": 0, "top_p": 0.9, "top_k": 5, "seed": 1, "max_tokens": 10},
            ["seed", "temperature", "top_k", "top_p"],
            {"max_tokens": 10},
        ),
        (
            "openai",
            {"max_tokens": 10, "max_completion_tokens": 20, "top_k": 5, "thinking": {"type": "enabled"}},
            ["max_tokens", "thinking", "top_k"],
            {"max_completion_tokens": 20},
        ),
        ("openai", {"max_tokens": 10, "stop_sequences": ["X"]}, None, {"max_completion_tokens": 10, "stop": ["X"]}),
        (
            "gemini",
            {"temperature": 0.1, "user": "u", "logit_bias": {}, "max_completion_tokens": 9},
            ["logit_bias", "user"],
            {"generationConfig": {"temperature": 0.1, "maxOutputTokens": 9}},
        ),
    ],
)
def test_parameters_a_provider_does_not_take_are_left_out_and_named(
    provider: str, params: dict[str, Any], dropped: list[str] | None, sent: dict[str, Any]
) -> None:
    line = {"model": "m", "messages": [{"role": "user", "content": "Q"}], **params}
    call, row = stored(line, provider=provider)
    assert row["dropped_params"] == dropped
    assert row["params"] == params  # the request as asked stays on record
    body = WRITERS[provider](call)
    wire = {k: v for k, v in body.items() if k not in ("model", "messages", "contents")}
    assert wire == sent


@pytest.mark.parametrize(
    ("provider", "line", "message"),
    [
        (
            "anthropic",
            {"messages": [{"role": "user", "name": "bob", "content": "Q"}]},
            "messages[0].name: anthropic has no name for a message's author",
        ),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": "Q"}], "response_format": {"type": "json_object"}},
            "response_format: anthropic takes structured output only as a JSON schema",
        ),
        (
            "anthropic",
            {
                "messages": [
                    {"role": "user", "content": "Q"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}],
                    },
                    {"role": "tool", "tool_call_id": "c", "content": "r"},
                ]
            },
            "messages[1].tool_calls[0].function.arguments: anthropic takes tool call arguments only as a JSON object",
        ),
        (
            "gemini",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]}
                ]
            },
            "messages[0].content[0].image_url: gemini takes images only as data (a data: URL), not by URL",
        ),
        (
            "gemini",
            {"messages": [{"role": "user", "content": "Q"}], "tools": [{"type": "web_search"}]},
            "params.tools[0].type: gemini has no 'web_search' tool",
        ),
        (
            "openai",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "text", "data": "d", "media_type": "t"}}],
                    }
                ]
            },
            "messages[0].content[0].type: openai has no 'document' block",
        ),
    ],
)
def test_what_a_target_cannot_say_is_refused_at_enqueue_in_one_line(
    provider: str, line: dict[str, Any], message: str
) -> None:
    with pytest.raises(EnqueueError) as raised:
        stored({"model": "m", **line}, provider=provider)
    assert str(raised.value) == message


def test_a_tool_message_without_its_call_id_is_refused() -> None:
    with pytest.raises(EnqueueError, match=r"messages\[1\]\.tool_call_id: a tool message needs the id"):
        stored({"model": "m", "messages": [{"role": "user", "content": "Q"}, {"role": "tool", "content": "r"}]})


def test_content_null_is_taken_only_for_an_assistant_turn_of_tool_calls() -> None:
    with pytest.raises(EnqueueError, match=r"messages\[0\]\.content must be a string or a list"):
        stored({"model": "m", "messages": [{"role": "user", "content": None}]})


def test_the_writers_know_the_parameters_the_pinned_sdks_define() -> None:
    from anthropic.types.message_create_params import MessageCreateParamsBase
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase
    from openai.types.responses.response_create_params import ResponseCreateParamsBase

    assert set(typing.get_type_hints(MessageCreateParamsBase)) - {"model", "messages", "system"} == MESSAGES_PARAMS
    # max_tokens: deprecated, always sent as max_completion_tokens.
    chat = set(typing.get_type_hints(CompletionCreateParamsBase)) - {"model", "messages", "max_tokens"}
    assert chat == CHAT_PARAMS
    responses = set(typing.get_type_hints(ResponseCreateParamsBase)) - {"model", "input", "instructions"}
    assert responses == RESPONSES_PARAMS - {"stream"}


def test_an_evaluation_schema_goes_to_anthropic_as_output_config_not_as_prompt_text() -> None:
    call = CallRequest("claude", [{"role": "user", "content": "Judge."}], "Be fair.", {"temperature": 0}, SCHEMA)
    body = messages_body(call)
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert body["system"] == "Be fair."
    assert "temperature" not in body
    assert json.dumps(SCHEMA) not in json.dumps(body["system"])


def test_a_chat_tool_result_is_refused_for_the_responses_api() -> None:
    messages = [{"role": "user", "content": "Q"}, {"role": "tool", "tool_call_id": "c", "content": "r"}]
    with pytest.raises(EnqueueError) as raised:
        checked_row(build_spec(model="m", messages=messages, api="responses"))
    assert str(raised.value) == (
        "messages[1].role: openai takes tool calls and results as function_call items in api 'responses'"
    )


@pytest.mark.parametrize("name", ["max_output_tokens", "max_tokens"])
def test_an_output_limit_the_responses_api_refuses_is_refused_at_enqueue(name: str) -> None:
    spec = build_spec(model="m", messages=[{"role": "user", "content": "Q"}], api="responses", params={name: 5})
    with pytest.raises(EnqueueError) as raised:
        checked_row(spec)
    assert str(raised.value) == f"params.{name}: openai api 'responses' takes at least 16 output tokens, got 5"
    spec.params = {name: 16}
    assert checked_row(spec)[0]["params"] == {name: 16}
