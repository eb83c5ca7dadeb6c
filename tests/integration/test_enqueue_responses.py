"""`ledger enqueue` of OpenAI Responses API lines (`url: /v1/responses`): stored as requests for that
API; `stream: true` and `background: true` refused in one line with nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger.api import Ledger
from ledger.enqueue import EnqueueError
from ledger.settings import load_settings
from ledger.store import Store
from tests.integration.test_enqueue_cli import enqueue, write_jsonl

SCHEMA = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}


def responses_line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"resp-{i}",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "gpt-4.1-mini", "input": f"Essay {i}", "instructions": "Judge.", **body},
    }


def test_responses_lines_are_stored_for_the_responses_api(db_url: str, tmp_path: Path) -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Essay 2"}]}]
    text = {"format": {"type": "json_schema", "name": "grade", "schema": SCHEMA, "strict": True}, "verbosity": "low"}
    path = write_jsonl(
        tmp_path / "responses.jsonl",
        [
            responses_line(1, max_output_tokens=300, reasoning={"effort": "low"}),
            {**responses_line(2, text=text), "body": {**responses_line(2, text=text)["body"], "input": items}},
        ],
    )
    code, output = enqueue(db_url, path)
    assert code == 0, output
    store = Store(db_url)
    first, second = (store.get_request(r["id"]) for r in store.list_requests())
    assert first is not None and second is not None
    assert first["api"] == second["api"] == "responses"
    assert first["provider"] == "openai"
    assert first["input"] == {"system": "Judge.", "messages": [{"role": "user", "content": "Essay 1"}]}
    assert first["params"] == {"max_output_tokens": 300, "reasoning": {"effort": "low"}}
    assert second["input"]["messages"] == items  # input items kept as given
    # A JSON schema in text.format is the request's response format, in chat's shape.
    assert second["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "grade", "schema": SCHEMA, "strict": True},
    }
    assert second["params"] == {"text": {"verbosity": "low"}}
    store.close()


@pytest.mark.parametrize("flag", ["stream", "background"])
def test_a_streamed_or_background_responses_line_is_refused_with_nothing_written(
    db_url: str, tmp_path: Path, flag: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [responses_line(1), responses_line(2, **{flag: True})])
    code, output = enqueue(db_url, path)
    assert code == 2
    assert output.strip().splitlines() == [
        f"error: {path}:2: params.{flag}: true is not supported (the ledger makes one call and waits for its answer)"
    ]
    store = Store(db_url)
    assert store.list_requests() == []
    store.close()


def test_the_python_api_takes_api_responses_and_refuses_it_where_no_provider_serves_it(db_url: str) -> None:
    with Ledger(settings=load_settings(LEDGER_DATABASE_URL=db_url)) as ledger:
        request_id = ledger.enqueue(
            model="gpt-4.1-mini", messages=[{"role": "user", "content": "Hi"}], api="responses", system="Be brief."
        )
        stored = ledger.store.get_request(request_id)
        assert stored is not None and stored["api"] == "responses"
        assert stored["input"]["system"] == "Be brief."
        with pytest.raises(EnqueueError, match=r"^api: provider 'anthropic' has no Responses API"):
            ledger.enqueue(
                model="claude-haiku-4-5",
                provider="anthropic",
                messages=[{"role": "user", "content": "x"}],
                api="responses",
            )
        with pytest.raises(EnqueueError, match=r"^params\.background: true is not supported"):
            ledger.enqueue(
                model="m", messages=[{"role": "user", "content": "x"}], api="responses", params={"background": True}
            )
        chat = ledger.store.get_request(
            ledger.enqueue(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
        )
        claude = ledger.store.get_request(
            ledger.enqueue(model="claude-haiku-4-5", provider="anthropic", messages=[{"role": "user", "content": "x"}])
        )
        assert chat is not None and claude is not None
        assert (chat["api"], claude["api"]) == ("chat", "messages")
        assert len(ledger.store.list_requests()) == 3
