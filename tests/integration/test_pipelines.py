"""Pipelines of stages on both databases: a parser per request (online and through a provider batch),
lineage and its recursive walk (the query of docs/pipelines.md), reparse of any job."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.answers import mock_verdict
from ledger.api import Ledger
from ledger.cli import app
from ledger.enqueue import EnqueueError
from ledger.parsing import parse_verdict
from tests.integration.batch_helpers import batch_settings, run

PIPELINES_DOC = Path(__file__).parents[2] / "docs" / "pipelines.md"
CODE = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[0-9]+$"}}, "required": ["code"]}
GRADE = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}, "why": {"type": "string"}},
    "required": ["score", "why"],
}


@pytest.fixture(scope="module")
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def scoring(i: int, delivery: str, **more: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"Score essay {i} ({delivery}). End with VERDICT: <1-5>."}],
        "idempotency_key": f"score:{delivery}:{i}",
        "job_id": f"stage-{delivery}",
        "delivery": delivery,
        "parse": "verdict",
        **more,
    }


@pytest.mark.parametrize("delivery", ["online", "batch"])
def test_a_plain_request_with_parse_verdict_comes_back_parsed(
    db_url: str, mock: RunningMockProvider, delivery: str
) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        ids = [ledger.enqueue(scoring(i, delivery)) for i in range(6)]
        wide = ledger.enqueue(scoring(9, delivery, score_range=(3, 4), idempotency_key=f"narrow:{delivery}"))
        run(settings)
        rows = anyio.run(lambda: ledger.await_results([*ids, wide], timeout=5))
    for i, row in enumerate(rows[:-1]):
        prompt = [{"role": "user", "content": f"Score essay {i} ({delivery}). End with VERDICT: <1-5>."}]
        verdict = parse_verdict(row["raw_output"])
        assert verdict.score == mock_verdict("gpt-4o-mini", None, prompt)  # computed, not hard-coded
        assert row["parsed_verdict"] == verdict.score is not None
        assert row["reasoning"] == verdict.reasoning and row["reasoning"]
        assert row["verdict_text"] == verdict.verdict_text and row["verdict_text"].startswith("VERDICT:")
        assert row["parse_error"] is None and row["parse"] == "verdict"
    narrow = rows[-1]
    score = parse_verdict(narrow["raw_output"]).score
    assert narrow["parse"] == "verdict:3-4"
    if score in (3, 4):
        assert narrow["parsed_verdict"] == score and narrow["parse_error"] is None
    else:
        assert narrow["parsed_verdict"] is None and narrow["parse_error"] == f"score {score} outside 3..4"


def test_parse_json_keeps_valid_answers_and_flags_invalid_ones(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    asks = {
        "valid": {"type": "json_schema", "json_schema": {"name": "grade", "schema": GRADE, "strict": True}},
        "invalid": {"type": "json_schema", "json_schema": {"name": "code", "schema": CODE}},
        "not_json": None,
    }
    with Ledger(settings=settings) as ledger:
        ids = {
            name: ledger.enqueue(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": f"Grade it ({name})."}],
                response_format=response_format,
                parse="json",
                job_id="json-stage",
            )
            for name, response_format in asks.items()
        }
        run(settings)
        rows = {name: row for name, row in zip(ids, ledger.wait(list(ids.values()), timeout=5), strict=True)}
    valid = rows["valid"]
    assert valid["parse_error"] is None and valid["parsed"] == json.loads(valid["raw_output"])
    assert 1 <= valid["parsed"]["score"] <= 5
    invalid = rows["invalid"]
    assert invalid["parsed"] is None and invalid["raw_output"]  # the raw output is kept as it came
    assert invalid["parse_error"].startswith("does not match the schema at code: ")
    assert rows["not_json"]["parse_error"].startswith("output is not JSON")


def test_reparse_recomputes_any_jobs_derived_fields_without_a_call(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        ids = [ledger.enqueue(scoring(i, "online", job_id="redo")) for i in range(3)]
        run(settings)
        before = ledger.wait(ids, timeout=5)
        with ledger.store.engine.begin() as conn:  # a parser "bug": the derived fields lost
            conn.execute(text("UPDATE llm_requests SET parsed_verdict = NULL, reasoning = NULL WHERE job_id = 'redo'"))
        calls = mock.stats()["calls"]
        said = CliRunner().invoke(app, ["reparse", "--job", "redo"], env={"LEDGER_DATABASE_URL": db_url})
        assert said.exit_code == 0, said.output
        assert said.stdout.strip() == "reparsed job redo: 3 request(s) from stored output, no provider call"
        after = ledger.wait(ids, timeout=5)
        assert ledger.reparse("redo") == 3
    assert mock.stats()["calls"] == calls
    assert [(r["parsed_verdict"], r["reasoning"]) for r in after] == [
        (r["parsed_verdict"], r["reasoning"]) for r in before
    ]
    unknown = CliRunner().invoke(app, ["reparse", "--job", "nope"], env={"LEDGER_DATABASE_URL": db_url})
    assert unknown.exit_code == 1 and "no job 'nope'" in unknown.output


def lineage_query() -> str:
    (query,) = re.findall(r"```sql\n(.*?)```", PIPELINES_DOC.read_text(), flags=re.S)
    return query


def test_the_documented_recursive_query_walks_a_score_back_to_its_evidence(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock)

    def ask(key: str, purpose: str, sources: list[int] | None = None) -> dict[str, Any]:
        return {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": key}],
            "idempotency_key": key,
            "purpose": purpose,
            "sources": sources,
        }

    with Ledger(settings=settings) as ledger:
        evidence = [ledger.enqueue(ask(f"evidence:{i}", "evidence")) for i in range(2)]
        rubric = ledger.enqueue(ask("rubric", "rubric", [evidence[0]]))
        critic = ledger.enqueue(ask("critic", "critic", [rubric]))
        score = ledger.enqueue(ask("score", "score", [rubric, critic, evidence[1]]))
        unrelated = ledger.enqueue(ask("other", "evidence"))
        with ledger.store.engine.connect() as conn:
            walked = [dict(r._mapping) for r in conn.execute(text(lineage_query()), {"request_id": score})]
        assert [(r["id"], r["depth"], r["purpose"]) for r in walked] == [
            (evidence[1], 1, "evidence"),
            (rubric, 1, "rubric"),
            (critic, 1, "critic"),
            (evidence[0], 2, "evidence"),
        ]
        assert unrelated not in {r["id"] for r in walked}
        assert ledger.lineage(score) == walked
        assert ledger.store.sources_of(rubric) == {"sources": [evidence[0]], "built_from_it": [critic, score]}
        shown = CliRunner().invoke(app, ["show", str(rubric)], env={"LEDGER_DATABASE_URL": db_url})
        assert f"sources: {evidence[0]}" in shown.stdout.splitlines()
        assert f"built from it: {critic}, {score}" in shown.stdout.splitlines()
        # A source that is not in the ledger: one line, nothing written.
        count = len(ledger.store.list_requests())
        with pytest.raises(EnqueueError, match=r"^sources: request 999999 is not in the ledger$"):
            ledger.enqueue(ask("dangling", "score", [rubric, 999999]))
        with pytest.raises(EnqueueError, match=r"^requests\[1\]: sources: request 999999 is not in the ledger$"):
            ledger.enqueue_many([ask("fine", "score", [rubric]), ask("dangling", "score", [999999])])
        assert len(ledger.store.list_requests()) == count


def test_a_jsonl_line_names_its_parser_and_sources(db_url: str, mock: RunningMockProvider, tmp_path: Path) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        source = ledger.enqueue(model="gpt-4o-mini", messages=[{"role": "user", "content": "evidence"}])
    lines = [
        {"custom_id": "a", "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "A"}]}},
        {
            "custom_id": "b",
            "parse": "verdict",
            "score_range": [0, 10],
            "sources": [source],
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "B"}]},
        },
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "C"}], "parse": "json", "sources": [source]},
    ]
    path = tmp_path / "stage.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    said = CliRunner().invoke(app, ["enqueue", str(path)], env={"LEDGER_DATABASE_URL": db_url})
    assert said.exit_code == 0, said.output
    with Ledger(settings=settings) as ledger:
        rows = {r["idempotency_key"]: ledger.store.get_request(r["id"]) for r in ledger.store.list_requests()}
        bare = next(r for r in rows.values() if r["input"]["messages"][0]["content"] == "C")
        assert (rows["a"]["parse"], rows["b"]["parse"], bare["parse"]) == (None, "verdict:0-10", "json")
        assert rows["b"]["sources"] == [source] and bare["sources"] == [source]
        assert "parse" not in (bare["params"] or {}) and "sources" not in (bare["params"] or {})
        assert ledger.store.sources_of(source)["built_from_it"] == sorted([rows["b"]["id"], bare["id"]])
    overridden = tmp_path / "all.jsonl"
    overridden.write_text(json.dumps({**lines[0], "custom_id": "d"}) + "\n")
    said = CliRunner().invoke(
        app, ["enqueue", str(overridden), "--parse", "verdict"], env={"LEDGER_DATABASE_URL": db_url}
    )
    assert said.exit_code == 0, said.output
    with Ledger(settings=settings) as ledger:
        stored = ledger.store.get_request(ledger.store.id_for_key("d"))
        assert stored is not None and stored["parse"] == "verdict"
