"""The mock provider refuses what the providers refuse, in each provider's own error shape, and
still answers the valid form: online through the real SDKs, and line by line in batches."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.openai_spec import validator

CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
# An OpenAI tool conversation: the assistant's call (content null, as OpenAI returns it), its result.
LINKED = [
    {"role": "user", "content": "look it up"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "found"},
]
UNLINKED = [*LINKED[:2], {"role": "tool", "content": "found"}]  # the result lost its call id
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}}
ANTHROPIC_TOOLS = [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}}]
ANTHROPIC_LINKED = [
    {"role": "user", "content": "look it up"},
    {"role": "assistant", "content": [TOOL_USE]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "found"}]},
]
GEMINI_REQUEST = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}


@pytest.fixture(scope="module")
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def poll(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not done(value := fetch()):
        assert time.monotonic() < deadline, "batch did not end in time"
        time.sleep(0.05)
    return value


def openai_error(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert validator("ErrorResponse").is_valid(body), body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def openai_client(mock: RunningMockProvider, azure: bool) -> openai.OpenAI:
    """The OpenAI SDK's client for the mock, or Azure OpenAI's (the same wire, other routes)."""
    if azure:
        return openai.AzureOpenAI(api_key="k", azure_endpoint=mock.base_url, api_version="2024-10-21", max_retries=0)
    return openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)


# -- online ---------------------------------------------------------------------------------


@pytest.mark.parametrize("azure", [False, True])
def test_openai_refuses_a_tool_result_without_its_call_id_and_answers_the_linked_one(
    mock: RunningMockProvider, azure: bool
) -> None:
    client = openai_client(mock, azure)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4o-mini", messages=UNLINKED, tools=TOOLS)  # type: ignore[arg-type]
    assert refused.value.status_code == 400
    assert openai_error(refused.value) == {
        "message": "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
        "type": "invalid_request_error",
        "param": "messages.[2].tool_call_id",
        "code": None,
    }
    answered = client.chat.completions.create(model="gpt-4o-mini", messages=LINKED, tools=TOOLS)  # type: ignore[arg-type]
    assert answered.choices[0].message.content


def test_openai_refuses_an_argument_it_does_not_know_and_a_result_of_no_call(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4o-mini", messages=LINKED[:1], extra_body={"top_k": 5})  # type: ignore[arg-type]
    assert openai_error(refused.value)["message"] == "Unrecognized request argument supplied: top_k"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-4o-mini", messages=[LINKED[0], LINKED[2]])  # type: ignore[arg-type]
    error = openai_error(refused.value)
    assert "must be a response to a preceeding message with 'tool_calls'" in error["message"]
    assert error["param"] == "messages.[1].role"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-4o-mini", input="hi", extra_body={"max_tokens": 10})
    assert openai_error(refused.value)["message"] == "Unrecognized request argument supplied: max_tokens"
    output = {"type": "function_call_output", "call_id": "call_9", "output": "found"}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-4o-mini", input=[{"role": "user", "content": "hi"}, output])  # type: ignore[list-item]
    assert "No tool call found for function call output with call_id call_9" in openai_error(refused.value)["message"]
    call = {"type": "function_call", "call_id": "call_9", "name": "lookup", "arguments": "{}"}
    answered = client.responses.create(model="gpt-4o-mini", input=[{"role": "user", "content": "hi"}, call, output])  # type: ignore[list-item]
    assert answered.output_text


def anthropic_error(exc: anthropic.APIStatusError) -> str:
    body = exc.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}
    return str(body["error"]["message"])


def test_anthropic_refuses_unknown_keys_and_a_tool_role_and_answers_the_valid_form(mock: RunningMockProvider) -> None:
    client = anthropic.Anthropic(api_key="k", base_url=mock.anthropic_base_url, max_retries=0)
    asked: dict[str, Any] = {"model": "claude-haiku-4-5", "max_tokens": 100}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**asked, messages=ANTHROPIC_LINKED[:1], extra_body={"temperature": 0})
    assert refused.value.status_code == 400
    assert anthropic_error(refused.value) == "temperature: Extra inputs are not permitted"
    nested = [{"role": "user", "content": [{"type": "text", "text": "hi", "colour": "red"}]}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**asked, messages=nested)  # type: ignore[arg-type]
    assert anthropic_error(refused.value) == "messages.0.content.0.colour: Extra inputs are not permitted"
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**asked, messages=[*LINKED[:1], {"role": "tool", "content": "found"}])  # type: ignore[list-item]
    assert anthropic_error(refused.value).startswith("messages.1: Input tag 'tool' found using 'role'")
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(**asked, messages=[ANTHROPIC_LINKED[0], ANTHROPIC_LINKED[2]])  # type: ignore[arg-type]
    assert "unexpected `tool_use_id` found in `tool_result` blocks: toolu_1" in anthropic_error(refused.value)
    answered = client.messages.create(**asked, messages=ANTHROPIC_LINKED, tools=ANTHROPIC_TOOLS)  # type: ignore[arg-type]
    assert answered.content[0].type == "text"


def test_gemini_refuses_an_unknown_field_and_a_result_of_no_call_and_answers_the_valid_form(
    mock: RunningMockProvider,
) -> None:
    client = genai.Client(api_key="k", http_options=genai_types.HttpOptions(base_url=mock.base_url))
    unknown = genai_types.GenerateContentConfig(http_options=genai_types.HttpOptions(extra_body={"colour": "red"}))
    with pytest.raises(genai_errors.ClientError) as refused:
        client.models.generate_content(model="gemini-2.5-flash", contents="hello", config=unknown)
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
    assert refused.value.message == 'Invalid JSON payload received. Unknown name "colour": Cannot find field.'
    orphan = genai_types.Content(
        role="user", parts=[genai_types.Part.from_function_response(name="lookup", response={"found": True})]
    )
    with pytest.raises(genai_errors.ClientError) as refused:
        client.models.generate_content(model="gemini-2.5-flash", contents=[orphan])
    assert (
        refused.value.message is not None and "function response turn comes immediately after" in refused.value.message
    )
    call = genai_types.Content(role="model", parts=[genai_types.Part.from_function_call(name="lookup", args={})])
    answered = client.models.generate_content(model="gemini-2.5-flash", contents=["look it up", call, orphan])
    assert answered.text


def test_a_body_that_is_not_json_is_refused_in_each_providers_shape(mock: RunningMockProvider) -> None:
    said = httpx.post(mock.openai_base_url + "/chat/completions", content=b"{", timeout=10)
    assert said.status_code == 400 and said.json()["error"]["type"] == "invalid_request_error"
    said = httpx.post(mock.base_url + "/v1/messages", content=b"{", timeout=10)
    assert said.status_code == 400 and said.json()["type"] == "error"
    said = httpx.post(
        mock.base_url + "/v1beta/models/gemini-2.5-flash:generateContent",
        content=b"{",
        headers={"x-goog-api-key": "k"},
        timeout=10,
    )
    assert said.status_code == 400 and said.json()["error"]["status"] == "INVALID_ARGUMENT"


# -- batches ----------------------------------------------------------------------------------


def jsonl(rows: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO("".join(json.dumps(r) + "\n" for r in rows).encode())


def test_a_batch_upload_not_named_jsonl_is_refused_as_openai_refuses_it(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("batch-3.input", jsonl([line])), purpose="batch")
    assert refused.value.status_code == 400
    assert openai_error(refused.value)["message"] == (
        "Invalid file format for Batch API: 'batch-3.input'. Batch input files must be .jsonl files."
    )
    assert client.files.create(file=("batch-3.jsonl", jsonl([line])), purpose="batch").filename == "batch-3.jsonl"


def openai_batch(client: openai.OpenAI, endpoint: str, bodies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Run a batch of `bodies` by custom id; each line's output or error-file row, by custom id."""
    url = endpoint.removeprefix("/v1") if isinstance(client, openai.AzureOpenAI) else endpoint
    lines = [{"custom_id": cid, "method": "POST", "url": url, "body": body} for cid, body in bodies.items()]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]
    ended = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    found: dict[str, dict[str, Any]] = {}
    for file_id in (ended.output_file_id, ended.error_file_id):
        if file_id:
            for text in client.files.content(file_id).text.splitlines():
                row = json.loads(text)
                assert validator("BatchRequestOutput").is_valid(row), row
                found[row["custom_id"]] = row
    return found


@pytest.mark.parametrize("azure", [False, True])
def test_an_openai_batch_line_the_api_refuses_answers_its_error_and_the_others_are_answered(
    mock: RunningMockProvider, azure: bool
) -> None:
    client = openai_client(mock, azure)
    bad = {"model": "gpt-4o-mini", "messages": UNLINKED, "tools": TOOLS}
    found = openai_batch(client, "/v1/chat/completions", {"good": {**bad, "messages": LINKED}, "bad": bad})
    assert found["good"]["response"]["status_code"] == 200
    assert found["good"]["response"]["body"]["choices"][0]["message"]["content"]
    refused = found["bad"]["response"]
    assert refused["status_code"] == 400 and validator("ErrorResponse").is_valid(refused["body"])
    assert refused["body"]["error"]["param"] == "messages.[2].tool_call_id"
    assert refused["body"]["error"]["message"].startswith("Missing parameter 'tool_call_id'")


def test_a_responses_batch_line_with_an_unknown_argument_answers_its_error(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    good = {"model": "gpt-4o-mini", "input": "hello", "max_output_tokens": 300}
    found = openai_batch(
        client, "/v1/responses", {"good": good, "bad": {"model": "gpt-4o-mini", "input": "hi", "n": 2}}
    )
    assert validator("Response").is_valid(found["good"]["response"]["body"])
    error = found["bad"]["response"]["body"]["error"]
    assert (found["bad"]["response"]["status_code"], error["message"]) == (
        400,
        "Unrecognized request argument supplied: n",
    )


def test_an_openai_batch_file_whose_line_is_no_batch_request_fails_naming_the_line(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    body = {"model": "gpt-4o-mini", "messages": LINKED[:1]}
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body},
        {"method": "POST", "url": "/v1/chat/completions", "body": body},
    ]
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data is not None
    (error,) = batch.errors.data
    assert (error.line, error.param, error.code) == (2, "custom_id", "missing_required_parameter")


def test_an_anthropic_batch_entry_the_api_refuses_ends_errored_and_the_others_succeed(
    mock: RunningMockProvider,
) -> None:
    client = anthropic.Anthropic(api_key="k", base_url=mock.anthropic_base_url, max_retries=0)
    asked = {"model": "claude-haiku-4-5", "max_tokens": 100}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.batches.create(requests=[{"custom_id": "a", "params": asked, "priority": 1}])  # type: ignore[typeddict-unknown-key]
    assert anthropic_error(refused.value) == "requests.0.priority: Extra inputs are not permitted"
    requests = [
        {"custom_id": "good", "params": {**asked, "messages": ANTHROPIC_LINKED, "tools": ANTHROPIC_TOOLS}},
        {"custom_id": "role", "params": {**asked, "messages": [LINKED[0], {"role": "tool", "content": "found"}]}},
        {"custom_id": "temp", "params": {**asked, "messages": LINKED[:1], "temperature": 0}},
    ]
    batch = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    poll(lambda: client.messages.batches.retrieve(batch.id), lambda b: b.processing_status == "ended")
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert results["good"].type == "succeeded"
    for custom_id, said in (("role", "messages.1: Input tag 'tool'"), ("temp", "temperature: Extra inputs")):
        result = results[custom_id]
        assert result.type == "errored" and result.error.error.type == "invalid_request_error"
        assert result.error.error.message.startswith(said)


@pytest.mark.parametrize("inline", [False, True])
def test_a_gemini_batch_request_with_an_unknown_field_answers_its_error(
    mock: RunningMockProvider, inline: bool
) -> None:
    bad = {**GEMINI_REQUEST, "generationConfig": {"maxOutputTokens": 50, "colour": "red"}}
    entries = [{"key": "good", "request": GEMINI_REQUEST}, {"key": "bad", "request": bad}]
    headers = {"x-goog-api-key": "k"}
    if inline:
        config: dict[str, Any] = {
            "requests": {"requests": [{"request": e["request"], "metadata": {"key": e["key"]}} for e in entries]}
        }
    else:
        start = httpx.post(
            mock.base_url + "/upload/v1beta/files",
            json={"file": {"displayName": "in.jsonl"}},
            headers=headers | {"x-goog-upload-command": "start"},
        )
        done = httpx.post(
            start.headers["x-goog-upload-url"],
            content=jsonl(entries).getvalue(),
            headers=headers | {"x-goog-upload-command": "upload, finalize"},
        )
        config = {"fileName": done.json()["file"]["name"]}
    created = httpx.post(
        mock.base_url + "/v1beta/models/gemini-2.5-flash:batchGenerateContent",
        json={"batch": {"displayName": "t", "inputConfig": config}},
        headers=headers,
    ).json()
    ended = poll(
        lambda: httpx.get(f"{mock.base_url}/v1beta/{created['name']}", headers=headers).json(), lambda b: b["done"]
    )
    output = ended["metadata"]["output"]
    if inline:
        found = {r["metadata"]["key"]: r for r in output["inlinedResponses"]["inlinedResponses"]}
    else:
        file_id = output["responsesFile"]
        text = httpx.get(f"{mock.base_url}/v1beta/{file_id}:download?alt=media", headers=headers).text
        found = {r["key"]: r for r in map(json.loads, text.splitlines())}
    genai_types.GenerateContentResponse.model_validate(found["good"]["response"])
    assert found["bad"]["error"] == {
        "code": 400,
        "status": "INVALID_ARGUMENT",
        "message": "Invalid JSON payload received. Unknown name \"colour\" at 'generation_config': Cannot find field.",
    }
