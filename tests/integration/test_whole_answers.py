"""The whole answer on record: tool calls, cut-off answers, refusals, thinking, cached prompt tokens
and reasoning tokens, through the real SDKs against the mock provider, online and in provider
batches, on both databases; and their cost from a price file the test writes.

Each API (chat completions, the Responses API, Anthropic Messages) gets one run per delivery
carrying one request of every answer kind; each kind is then checked on its own row, against
the body the mock sent (`GET /_answered/{id}`), through `ledger export --full`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.answers import REASONING_TOKENS, REFUSAL
from ledger.api import Ledger
from ledger.cli import app
from ledger.enqueue import build_spec
from ledger.settings import Settings
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, requests_t, rows, run

SYSTEM = "You are a meticulous reviewer of engineering documents. " * 20  # a long, shared prompt prefix
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
}
# USD per million tokens, written by the test: every rate differs, so a token priced at the wrong
# rate shows in the cost.
PRICES = {"input": 2.0, "output": 8.0, "cached_input": 0.5, "cache_write": 2.5, "batch_discount": 0.5}


@dataclass(frozen=True)
class Api:
    name: str
    provider: str
    model: str
    reasoning_model: str | None  # a model the mock answers with reasoning tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_output_tokens" if self.name == "responses" else "max_tokens"

    @property
    def cut_off_at(self) -> int:
        """An output limit the answer is cut off at (the Responses API takes no fewer than 16)."""
        return 16 if self.name == "responses" else 5

    def tools(self) -> list[dict[str, Any]]:
        if self.name == "chat":
            return [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
        if self.name == "responses":
            return [{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False}]
        if self.name == "gemini":  # Gemini's own shape, passed through as it is
            return [{"functionDeclarations": [{"name": "get_weather", "parametersJsonSchema": WEATHER}]}]
        return [{"name": "get_weather", "input_schema": WEATHER}]

    def thinking_params(self) -> dict[str, Any] | None:
        if self.name == "messages":
            return {"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 4000}
        if self.name == "responses":
            return {"reasoning": {"effort": "low", "summary": "auto"}}
        if self.name == "gemini":
            return {"thinkingConfig": {"includeThoughts": True}}
        return None  # chat completions carry no thinking from OpenAI


APIS = [
    Api("chat", "openai", "gpt-4.1-mini", "o4-mini"),
    Api("responses", "openai", "gpt-4.1-mini", "o4-mini"),
    Api("messages", "anthropic", "claude-haiku-4-5", None),
    Api("gemini", "gemini", "gemini-2.0-flash", "gemini-2.5-flash"),  # generateContent
]


@pytest.fixture(scope="module")
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def settings_for(db_url: str, mock: RunningMockProvider, tmp_path: Path, **overrides: Any) -> Settings:
    prices = tmp_path / "prices.toml"
    lines = ["[openai]", "[openai.models]", "[anthropic]", "[anthropic.models]", "[gemini]", "[gemini.models]"]
    entry = ", ".join(f"{k} = {v}" for k, v in PRICES.items())
    for api in APIS:
        for model in filter(None, (api.model, api.reasoning_model)):
            section = f"[{api.provider}.models]"
            lines.insert(lines.index(section) + 1, f'"{model}" = {{ {entry} }}')
    prices.write_text("\n".join(dict.fromkeys(lines)) + "\n")
    return batch_settings(db_url, mock, LEDGER_PRICES_FILE=str(prices), **overrides)


def expected_cost(row: dict[str, Any], *, batch: bool) -> float:
    """The cost formula, by hand: uncached x input + cached x cached_input + writes x
    cache_write + output x output, the batch discount on the whole."""
    cached, written = row["cached_input_tokens"] or 0, row["cache_write_tokens"] or 0
    uncached = row["input_tokens"] - cached - written
    usd = (
        uncached * PRICES["input"]
        + cached * PRICES["cached_input"]
        + written * PRICES["cache_write"]
        + row["output_tokens"] * PRICES["output"]
    ) / 1e6
    return usd * (1 - PRICES["batch_discount"]) if batch else usd


def every_kind(api: Api, delivery: str, tag: str) -> list[dict[str, Any]]:
    """One request per answer kind (two for the cache: a first call writes, a later one reads)."""
    user = [{"role": "user", "content": f"{tag}: review the design and give a VERDICT."}]
    system = f"[{tag}] {SYSTEM}"  # a prefix no earlier test has put in the mock's cache
    cacheable: list[dict[str, Any]] = user
    if api.name == "messages":  # Anthropic caches what a cache_control block ends
        block = {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}
        cacheable = [{"role": "user", "content": [block, {"type": "text", "text": f"{tag}: and now?"}]}]
    kinds: dict[str, dict[str, Any]] = {
        "plain": {"messages": user},
        "tools": {
            "messages": [{"role": "user", "content": f"{tag}: weather in Paris?"}],
            "params": {"tools": api.tools()},
        },
        "cut_off": {"messages": user, "params": {api.max_tokens_param: api.cut_off_at}, "system": "Be thorough."},
        "refusal": {"messages": [{"role": "user", "content": f"{tag}: [[mock:refuse]] do something bad"}]},
        "cached_first": {"messages": cacheable, "system": system, "params": {"temperature": 0}},
        "cached_second": {"messages": cacheable, "system": system, "params": {"temperature": 0.1}},
    }
    if api.thinking_params() is not None:
        kinds["thinking"] = {"messages": user, "params": api.thinking_params(), "system": "Think first."}
    if api.reasoning_model is not None:
        kinds["reasoning"] = {"messages": user, "model": api.reasoning_model}
    return [
        {
            "model": api.model,
            "provider": api.provider,
            "api": "responses" if api.name == "responses" else None,
            "delivery": delivery,
            "idempotency_key": f"{tag}:{kind}",
            "trace": {"kind": kind},
            **fields,
        }
        for kind, fields in kinds.items()
    ]


def run_every_kind(db_url: str, mock: RunningMockProvider, tmp_path: Path, api: Api, delivery: str) -> dict[str, Any]:
    settings = settings_for(db_url, mock, tmp_path)
    tag = f"{api.name}-{delivery}-{tmp_path.name}"
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(build_spec(**fields) for fields in every_kind(api, delivery, tag))
    before = mock.stats()
    run(settings)
    store = Store(db_url)
    found = {r["trace"]["kind"]: r for r in rows(store, requests_t)}
    assert all(r["status"] == "completed" for r in found.values()), [
        (k, r["error_message"]) for k, r in found.items() if r["status"] != "completed"
    ]
    after = mock.stats()
    created = sum(after["batch_creates"].values()) - sum(before["batch_creates"].values())
    if delivery == "batch":  # every answer came through a provider batch, none online
        assert created >= 1 and after["calls"] == before["calls"]
    else:
        assert created == 0 and after["calls"] - before["calls"] == len(found)
    return {"rows": found, "settings": settings, "store": store}


def exported(db_url: str) -> dict[str, dict[str, Any]]:
    result = CliRunner().invoke(app, ["export", "--full"], env={"LEDGER_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {line["trace"]["kind"]: line for line in lines}


@pytest.mark.parametrize("delivery", ["online", "batch"])
@pytest.mark.parametrize("api", APIS, ids=[a.name for a in APIS])
def test_every_answer_kind_is_recorded_whole(
    db_url: str, mock: RunningMockProvider, tmp_path: Path, api: Api, delivery: str
) -> None:
    found = run_every_kind(db_url, mock, tmp_path, api, delivery)["rows"]
    lines = exported(db_url)
    batch = delivery == "batch"
    expected_api = {"chat": "chat", "responses": "responses", "messages": "messages", "gemini": "chat"}[api.name]

    for kind, row in found.items():
        line = lines[kind]
        # The body as received, byte for byte as JSON: what the mock sent under that answer's id.
        answer_id = line["response"].get("id") or line["response"]["responseId"]  # Gemini's: responseId
        assert line["response"] == json.loads(mock.answered(answer_id)), kind
        assert line["api"] == expected_api
        assert row["cost_usd"] == pytest.approx(expected_cost(row, batch=batch), rel=1e-9, abs=1e-12), kind
        assert line["usage"]["input_tokens"] == row["input_tokens"]

    plain = lines["plain"]
    assert plain["finish_reason"] == "stop" and "VERDICT:" in plain["output"]
    assert plain["tool_calls"] in (None, []) and plain["refusal"] is None

    tools = lines["tools"]
    assert tools["finish_reason"] == "tool_calls"
    assert (
        tools["provider_finish_reason"]
        == {"chat": "tool_calls", "responses": "completed", "messages": "tool_use", "gemini": "STOP"}[api.name]
    )
    assert tools["output"] == ""  # an answer that is only a tool call has no text
    (call,) = tools["tool_calls"]
    assert call["name"] == "get_weather" and call["id"]
    arguments = json.loads(call["arguments"])
    assert isinstance(arguments["city"], str) and 1 <= arguments["days"] <= 7
    if api.name in ("messages", "gemini"):  # an object on the wire: serialised with sorted keys
        assert call["arguments"] == json.dumps(arguments, sort_keys=True, separators=(",", ":"))
    else:  # the exact text the model produced
        body = tools["response"]
        sent = (
            body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            if api.name == "chat"
            else next(item for item in body["output"] if item["type"] == "function_call")["arguments"]
        )
        assert call["arguments"] == sent

    cut = lines["cut_off"]
    assert cut["finish_reason"] == "length"
    assert (
        cut["provider_finish_reason"]
        == {"chat": "length", "responses": "max_output_tokens", "messages": "max_tokens", "gemini": "MAX_TOKENS"}[
            api.name
        ]
    )
    assert cut["usage"]["output_tokens"] == api.cut_off_at and "VERDICT" not in cut["output"]

    refusal = lines["refusal"]
    if api.name == "gemini":  # Gemini has no refusal: a safety stop, with no content
        assert refusal["refusal"] is None and refusal["finish_reason"] == "content_filter"
        assert refusal["provider_finish_reason"] == "SAFETY" and refusal["output"] == ""
    else:
        assert refusal["refusal"] == REFUSAL and refusal["finish_reason"] == "refusal"
        assert refusal["output"] == ("" if api.name != "messages" else REFUSAL)

    first, second = lines["cached_first"]["usage"], lines["cached_second"]["usage"]
    reads = sorted([first["cached_input_tokens"], second["cached_input_tokens"]])
    assert reads[0] == 0 and reads[1] > 0  # whichever reached the provider second read the cache
    if api.name == "messages":
        writes = sorted([first["cache_write_tokens"], second["cache_write_tokens"]])
        assert writes[0] == 0 and writes[1] == reads[1]  # the first wrote what the second read
        for usage in (first, second):  # every input token the model read, cache reads and writes included
            body = lines["cached_first" if usage is first else "cached_second"]["response"]["usage"]
            assert usage["input_tokens"] == (
                body["input_tokens"] + body["cache_read_input_tokens"] + body["cache_creation_input_tokens"]
            )
    else:
        assert first["cache_write_tokens"] is None and second["cache_write_tokens"] is None
    assert found["cached_first"]["cost_usd"] != found["cached_second"]["cost_usd"]

    if "thinking" in lines:
        thinking = lines["thinking"]
        assert thinking["thinking"] and thinking["thinking"].startswith("Let me weigh this.")
        assert thinking["thinking"] not in thinking["output"]  # thinking never reaches the text
        assert "VERDICT:" in thinking["output"]
    if "reasoning" in lines:
        reasoning = lines["reasoning"]["usage"]
        assert reasoning["reasoning_tokens"] == REASONING_TOKENS
        assert reasoning["output_tokens"] > REASONING_TOKENS  # reasoning is output, priced as output


def test_derived_keeps_the_fields_and_drops_the_body(db_url: str, mock: RunningMockProvider, tmp_path: Path) -> None:
    settings = settings_for(db_url, mock, tmp_path, LEDGER_KEEP_RESPONSE="derived")
    api = APIS[0]
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(build_spec(**f) for f in every_kind(api, "online", f"derived-{tmp_path.name}"))
    run(settings)
    found = {r["trace"]["kind"]: r for r in rows(Store(db_url), requests_t)}
    assert all(r["response"] is None for r in found.values())
    assert found["tools"]["finish_reason"] == "tool_calls" and found["tools"]["tool_calls"][0]["name"] == "get_weather"
    assert found["cut_off"]["finish_reason"] == "length"


def test_a_budget_settles_cached_calls_to_the_formula(db_url: str, mock: RunningMockProvider, tmp_path: Path) -> None:
    """Reserved while in flight, settled at the real cost: today's spend is the formula's sum."""
    done = run_every_kind(db_url, mock, tmp_path, APIS[2], "online")
    store: Store = done["store"]
    found = done["rows"]
    assert all(r["reserved_usd"] is None for r in found.values())
    assert store.spend_today() == pytest.approx(sum(expected_cost(r, batch=False) for r in found.values()), rel=1e-9)
    cached = [r for r in found.values() if r["cached_input_tokens"]]
    assert cached and all(r["cost_usd"] == pytest.approx(expected_cost(r, batch=False)) for r in cached)


def test_show_and_the_audit_view_give_the_answer_fields(db_url: str, mock: RunningMockProvider, tmp_path: Path) -> None:
    done = run_every_kind(db_url, mock, tmp_path, APIS[2], "online")
    found, store = done["rows"], done["store"]
    tools = found["tools"]
    shown = CliRunner().invoke(app, ["show", str(tools["id"])], env={"LEDGER_DATABASE_URL": db_url})
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert "finish_reason: tool_calls (provider: tool_use)" in lines
    call = tools["tool_calls"][0]
    assert f"tool call: get_weather({call['arguments']}) id {call['id']}" in lines
    cached = found["cached_second"] if found["cached_second"]["cached_input_tokens"] else found["cached_first"]
    shown = CliRunner().invoke(app, ["show", str(cached["id"])], env={"LEDGER_DATABASE_URL": db_url})
    usage = (
        f"usage: input {cached['input_tokens']} (cached {cached['cached_input_tokens']}, cache writes 0),"
        f" output {cached['output_tokens']}"
    )
    assert usage in shown.stdout.splitlines()
    thinking = CliRunner().invoke(app, ["show", str(found["thinking"]["id"])], env={"LEDGER_DATABASE_URL": db_url})
    assert f"thinking: {found['thinking']['thinking']}" in thinking.stdout.splitlines()
    with store.engine.connect() as conn:
        audited = {
            row.id: row
            for row in conn.execute(
                text(
                    "SELECT id, api, finish_reason, provider_finish_reason, refusal, cached_input_tokens,"
                    " cache_write_tokens, reasoning_tokens, thinking FROM llm_request_audit"
                )
            )
        }
    assert audited[tools["id"]].finish_reason == "tool_calls" and audited[tools["id"]].api == "messages"
    assert audited[found["refusal"]["id"]].refusal == REFUSAL
    assert audited[cached["id"]].cached_input_tokens == cached["cached_input_tokens"] > 0
