"""A tool conversation enqueued as an OpenAI line is a faithful record and is answered by every
provider, online and in its batch API: the real SDKs over HTTP to the mock provider, both
databases. `ledger enqueue`, `ledger show` and `ledger export` as a user runs them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from ledger.cli import app
from ledger.models import REQUEST_AUDIT_VIEW
from ledger.store import Store
from ledger.web import WebConfig, create_app
from tests.integration.batch_helpers import batch_settings, requests_t, rows, run

MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SYSTEM = "You answer questions about the weather."
# user -> assistant with two tool calls and `content: null` -> two tool results -> user.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "21C, cloudy"},
    {"role": "user", "content": "Which city is warmer?"},
]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER}}
]


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def env_of(db_url: str, mock: RunningMockProvider) -> dict[str, str]:
    settings = batch_settings(db_url, mock)
    return {
        "LEDGER_DATABASE_URL": db_url,
        "OPENAI_BASE_URL": mock.openai_base_url,
        "ANTHROPIC_BASE_URL": mock.anthropic_base_url,
        "GOOGLE_GEMINI_BASE_URL": str(settings.gemini_base_url),
        "OPENAI_API_KEY": "test-key",
        "ANTHROPIC_API_KEY": "test-key",
        "GEMINI_API_KEY": "test-key",
    }


def cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """A command as a user runs it; the `ledger` logger it pointed at the runner's captured stderr
    is put back afterwards (the daemon runs in this process next)."""
    logger = logging.getLogger("ledger")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        result = CliRunner().invoke(app, list(args), env=env)
    finally:
        logger.handlers[:], logger.propagate = handlers, propagate
        logger.setLevel(level)
    return result.exit_code, result.stdout, result.stderr


def openai_line(model: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, *CONVERSATION]
    return {
        "custom_id": "weather",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages, "tools": TOOLS, "tool_choice": "auto", **body},
    }


@pytest.mark.parametrize("delivery", ["online", "batch"])
@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_a_three_turn_tool_conversation_is_answered_by_every_provider_and_shown_as_given(
    db_url: str, mock: RunningMockProvider, tmp_path: Path, provider: str, delivery: str
) -> None:
    env = env_of(db_url, mock)
    path = tmp_path / "conversation.jsonl"
    path.write_text(json.dumps(openai_line(MODELS[provider], max_completion_tokens=200)) + "\n")
    code, out, err = cli(env, "enqueue", str(path), "--provider", provider, "--delivery", delivery)
    assert code == 0, out + err

    run(batch_settings(db_url, mock))

    store = Store(db_url)
    (row,) = rows(store, requests_t)
    assert row["status"] == "completed", row["error_message"]
    assert row["delivery"] == delivery and (row["batch_id"] is not None) == (delivery == "batch")
    assert row["raw_output"] or row["tool_calls"]  # the model's next turn, whichever it is
    assert row["input"] == {"system": SYSTEM, "messages": CONVERSATION}
    code, out, err = cli(env, "show", str(row["id"]))
    assert code == 0, err
    shown = next(line for line in out.splitlines() if line.startswith("input: "))
    assert json.loads(shown.removeprefix("input: ")) == {"system": SYSTEM, "messages": CONVERSATION}
    store.close()


def test_a_parameter_anthropic_does_not_take_is_named_once_and_recorded_on_each_request(
    db_url: str, mock: RunningMockProvider, tmp_path: Path
) -> None:
    env = env_of(db_url, mock)
    path = tmp_path / "requests.jsonl"
    lines = [{**openai_line(MODELS["anthropic"], temperature=0, top_p=0.5), "custom_id": f"w{i}"} for i in range(3)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out, err = cli(env, "enqueue", str(path), "--provider", "anthropic")
    assert code == 0, out + err
    assert [line for line in err.splitlines() if not line.startswith("{")] == [
        "warning: anthropic takes no temperature: left out of 3 request(s)",
        "warning: anthropic takes no top_p: left out of 3 request(s)",
    ]
    run(batch_settings(db_url, mock))

    store = Store(db_url)
    requests = rows(store, requests_t)
    assert [(r["status"], r["dropped_params"]) for r in requests] == [("completed", ["temperature", "top_p"])] * 3
    assert all(r["params"]["temperature"] == 0 for r in requests)  # what was asked stays on record
    code, out, _ = cli(env, "show", str(requests[0]["id"]))
    assert 'dropped_params: ["temperature", "top_p"]' in out.splitlines()
    code, out, _ = cli(env, "export")
    assert [json.loads(line)["dropped_params"] for line in out.splitlines()] == [["temperature", "top_p"]] * 3
    with store.engine.connect() as conn:
        from sqlalchemy import text

        audited = conn.execute(text(f"SELECT dropped_params FROM {REQUEST_AUDIT_VIEW} ORDER BY id")).scalars().all()
    assert [json.loads(v) if isinstance(v, str) else v for v in audited] == [["temperature", "top_p"]] * 3
    store.close()


@pytest.mark.parametrize(
    ("provider", "message", "problem"),
    [
        (
            "anthropic",
            {"role": "user", "name": "alice", "content": "Hi"},
            "messages[5].name: anthropic has no name for a message's author",
        ),
        (
            "gemini",
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
            "messages[5].content[0].image_url: gemini takes images only as data (a data: URL), not by URL",
        ),
    ],
)
def test_what_the_target_cannot_express_is_refused_at_enqueue_in_one_line_and_nothing_is_written(
    db_url: str, mock: RunningMockProvider, tmp_path: Path, provider: str, message: dict[str, Any], problem: str
) -> None:
    env = env_of(db_url, mock)
    path = tmp_path / "requests.jsonl"
    good = openai_line(MODELS[provider])
    bad = json.loads(json.dumps(good))
    bad["custom_id"] = "bad"
    bad["body"]["messages"].append(message)
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    code, _, err = cli(env, "enqueue", str(path), "--provider", provider)
    assert code != 0
    assert err.strip().splitlines() == [f"error: {path}:2: {problem}"], err
    store = Store(db_url)
    assert rows(store, requests_t) == []
    store.close()


def test_the_web_view_shows_the_tool_links_and_what_was_left_out(
    db_url: str, mock: RunningMockProvider, tmp_path: Path
) -> None:
    env = env_of(db_url, mock)
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps(openai_line(MODELS["anthropic"], temperature=0)) + "\n")
    assert cli(env, "enqueue", str(path), "--provider", "anthropic")[0] == 0
    store = Store(db_url)
    (row,) = rows(store, requests_t)
    app = create_app(store, batch_settings(db_url, mock), WebConfig(hosts=frozenset({"testserver"})))
    with TestClient(app) as client:
        page = client.get(f"/requests/{row['id']}").text
    assert "tool_call_id: <code>call_1</code>" in page  # each tool result names its call
    assert "get_weather" in page and "Paris" in page  # the assistant's tool calls
    assert '<p id="dropped-params">not sent (anthropic takes no such parameter): temperature</p>' in page
    store.close()
