"""The mock provider's answers are what the providers answer: each kind, as sent over HTTP, valid
against OpenAI's published spec (the vendored schemas) and the SDKs' own answer types, with no
field those types do not declare."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic.types
import httpx
import openai.types
import openai.types.chat
import openai.types.responses
import pydantic
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse
from google.genai import types as genai_types

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.openai_spec import source, validator

SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}}}
CHATS = {
    "plain": {"messages": [{"role": "user", "content": "Grade it."}]},
    "tool call": {
        "messages": [{"role": "user", "content": "Look it up."}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}}],
    },
    "refusal": {"messages": [{"role": "user", "content": "No. [[mock:refuse]]"}]},
    "cut": {"messages": [{"role": "user", "content": "Grade it."}], "max_completion_tokens": 3},
    "structured": {
        "messages": [{"role": "user", "content": "Grade it."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "grade", "schema": SCHEMA}},
    },
}
RESPONSES = {
    "plain": {"input": "Grade it.", "instructions": "Be strict.", "temperature": 0.2},
    "reasoning": {"input": "Grade it.", "reasoning": {"effort": "low", "summary": "auto"}},
    "tool call": {
        "input": [{"role": "user", "content": "Look it up."}],
        "tools": [{"type": "function", "name": "lookup", "parameters": SCHEMA, "strict": False}],
    },
    "refusal": {"input": "No. [[mock:refuse]]"},
    "cut": {"input": "Grade it.", "max_output_tokens": 16},
    "structured": {"input": "Grade it.", "text": {"format": {"type": "json_schema", "name": "g", "schema": SCHEMA}}},
}


@pytest.fixture(scope="module")
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def strictly(model: type[pydantic.BaseModel], body: Any) -> pydantic.BaseModel:
    """`body` as the SDK's answer type, refusing any field the type does not declare (the SDKs'
    answer types keep unknown fields aside rather than refuse them)."""
    found = model.model_validate(body)
    extras = list(_extras(found, model.__name__))
    assert not extras, f"fields {model.__name__} does not declare: {extras}"
    return found


def _extras(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, pydantic.BaseModel):
        for name in value.model_extra or {}:
            yield f"{where}.{name}"
        for name in type(value).model_fields:
            yield from _extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _extras(item, f"{where}[{i}]")


def spec_valid(name: str, body: Any) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator(name).iter_errors(body)]
    assert not errors, f"not a valid {name}: {errors[:3]}"


def post(mock: RunningMockProvider, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(mock.base_url + path, json=body, headers=headers, timeout=10)


def test_the_vendored_spec_names_its_source() -> None:
    named = source()
    assert named["spec"]["repository"] == "openai/openai-openapi" and len(named["spec"]["commit"]) == 40
    assert named["spec"]["openapi"].startswith("3.1")


@pytest.mark.parametrize("kind", list(CHATS))
def test_a_chat_completion_is_valid(mock: RunningMockProvider, kind: str) -> None:
    said = post(mock, "/v1/chat/completions", {"model": "gpt-4o-mini", **CHATS[kind]})
    assert said.status_code == 200
    spec_valid("CreateChatCompletionResponse", said.json())
    strictly(openai.types.chat.ChatCompletion, said.json())


@pytest.mark.parametrize("kind", list(RESPONSES))
def test_a_responses_object_is_valid(mock: RunningMockProvider, kind: str) -> None:
    said = post(mock, "/v1/responses", {"model": "o4-mini", **RESPONSES[kind]})
    assert said.status_code == 200
    spec_valid("Response", said.json())
    strictly(openai.types.responses.Response, said.json())
    if kind == "plain":  # the request's own settings are repeated, as the API does
        assert (said.json()["instructions"], said.json()["temperature"]) == ("Be strict.", 0.2)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"tools": [{"name": "lookup", "input_schema": SCHEMA}]},
        {"max_tokens": 3},
    ],
    ids=["plain", "thinking", "tool call", "cut"],
)
def test_an_anthropic_message_is_valid(mock: RunningMockProvider, extra: dict[str, Any]) -> None:
    asked = {"model": "claude-haiku-4-5", "max_tokens": 200, "messages": [{"role": "user", "content": "Grade."}]}
    said = post(mock, "/v1/messages", asked | extra)
    assert said.status_code == 200
    strictly(anthropic.types.Message, said.json())


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}},
        {"tools": [{"functionDeclarations": [{"name": "lookup", "parametersJsonSchema": SCHEMA}]}]},
        {"generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": SCHEMA}},
    ],
    ids=["plain", "thoughts", "tool call", "structured"],
)
def test_a_gemini_answer_is_valid(mock: RunningMockProvider, config: dict[str, Any]) -> None:
    asked = {"contents": [{"role": "user", "parts": [{"text": "Grade."}]}], **config}
    said = post(mock, "/v1beta/models/gemini-2.5-flash:generateContent", asked, **{"x-goog-api-key": "k"})
    assert said.status_code == 200
    genai_types.GenerateContentResponse.model_validate(said.json())  # the SDK's types refuse unknown fields


def test_error_bodies_are_each_providers_own(mock: RunningMockProvider) -> None:
    said = post(mock, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": []})
    assert said.status_code == 400
    spec_valid("ErrorResponse", said.json())
    for prompt in ("[[mock:fail=503x*]]", "[[mock:fail=429x*]]", "[[mock:quota]]"):
        said = post(
            mock, "/v1/chat/completions", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}
        )
        assert said.status_code >= 400
        spec_valid("ErrorResponse", said.json())
        asked = {"model": "claude-haiku-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": prompt}]}
        said = post(mock, "/v1/messages", asked)
        assert said.status_code >= 400
        strictly(anthropic.types.ErrorResponse, said.json() | {"request_id": None})
    said = post(mock, "/v1/messages", {"model": "claude-haiku-4-5", "messages": []})
    assert said.status_code == 400
    strictly(anthropic.types.ErrorResponse, said.json() | {"request_id": None})


def poll(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not done(value := fetch()):
        assert time.monotonic() < deadline, "batch did not end in time"
        time.sleep(0.05)
    return value


def test_openai_batch_objects_are_valid(mock: RunningMockProvider) -> None:
    lines = [
        {"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", **CHATS["plain"]}},
        {
            "custom_id": "failed",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "[[mock:fail=500x*]]"}]},
        },
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = httpx.post(
        mock.openai_base_url + "/files",
        files={"file": ("in.jsonl", io.BytesIO(content))},
        data={"purpose": "batch"},
        timeout=10,
    ).json()
    spec_valid("OpenAIFile", uploaded)
    strictly(openai.types.FileObject, uploaded)
    asked = {"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    created = post(mock, "/v1/batches", asked).json()
    ended = poll(
        lambda: httpx.get(f"{mock.openai_base_url}/batches/{created['id']}").json(), lambda b: b.get("completed_at")
    )
    for view in (created, ended):
        spec_valid("Batch", view)
        strictly(openai.types.Batch, view)
    for file_id in (ended["output_file_id"], ended["error_file_id"]):
        for text in httpx.get(f"{mock.openai_base_url}/files/{file_id}/content").text.splitlines():
            row = json.loads(text)
            spec_valid("BatchRequestOutput", row)
            body = row["response"]["body"]
            spec_valid("ErrorResponse" if "error" in body else "CreateChatCompletionResponse", body)


def test_anthropic_batch_objects_are_valid(mock: RunningMockProvider) -> None:
    asked = {"model": "claude-haiku-4-5", "max_tokens": 50}
    requests = [
        {"custom_id": "ok", "params": asked | {"messages": [{"role": "user", "content": "Grade."}]}},
        {"custom_id": "refused", "params": asked | {"messages": [{"role": "tool", "content": "x"}]}},
        {"custom_id": "failed", "params": asked | {"messages": [{"role": "user", "content": "[[mock:fail=500x*]]"}]}},
    ]
    created = post(mock, "/v1/messages/batches", {"requests": requests}).json()
    ended = poll(
        lambda: httpx.get(f"{mock.base_url}/v1/messages/batches/{created['id']}").json(),
        lambda b: b["processing_status"] == "ended",
    )
    for view in (created, ended):
        strictly(MessageBatch, view)
    lines = httpx.get(ended["results_url"]).text.splitlines()
    kinds = [strictly(MessageBatchIndividualResponse, json.loads(t)).result.type for t in lines]  # type: ignore[attr-defined]
    assert kinds == ["succeeded", "errored", "errored"]


def test_a_gemini_batch_file_is_valid(mock: RunningMockProvider) -> None:
    headers = {"x-goog-api-key": "k"}
    start = post(
        mock,
        "/upload/v1beta/files",
        {"file": {"displayName": "in.jsonl"}},
        **headers,
        **{"x-goog-upload-command": "start"},
    )
    line = json.dumps({"key": "a", "request": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}})
    done = httpx.post(
        start.headers["x-goog-upload-url"],
        content=line.encode(),
        headers=headers | {"x-goog-upload-command": "upload, finalize"},
    )
    genai_types.File.model_validate(done.json()["file"])
