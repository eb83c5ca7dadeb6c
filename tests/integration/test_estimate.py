"""`--estimate`: what a run will cost at most, by the budget's own formula, before anything is
written; the answers the ledger already holds count as cache hits. On both databases."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from adapters.mock_provider import running_mock_provider
from ledger.cli import app
from ledger.enqueue import Defaults, read_jsonl_file, to_row
from ledger.jobs import first_requests, trigger
from ledger.models import Job, LlmAttempt, LlmBatch, LlmRequest
from ledger.prices import input_bytes
from ledger.settings import Settings
from ledger.spec import load_spec
from ledger.store import Store
from tests.integration.batch_helpers import EXAMPLE_SPEC, batch_settings, run

TABLES = [LlmRequest.__table__, LlmAttempt.__table__, LlmBatch.__table__, Job.__table__]  # type: ignore[attr-defined]


def snapshot(db_url: str) -> Any:
    """The database as a reader sees it: a SQLite file's bytes; PostgreSQL's rows per table and
    the newest update."""
    if db_url.startswith("sqlite"):
        return hashlib.sha256(Path(db_url.removeprefix("sqlite:///")).read_bytes()).hexdigest()
    store = Store(db_url)
    with store.engine.connect() as conn:
        said = [conn.execute(select(func.count()).select_from(t)).scalar_one() for t in TABLES]
        said.append(conn.execute(select(func.max(LlmRequest.__table__.c.updated_at))).scalar())  # type: ignore[attr-defined]
    store.close()
    return said


def estimated(db_url: str, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, [*args, "--estimate", "--json"], env={"LEDGER_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def worst_cases(settings: Settings, specs: list[Any]) -> tuple[float, float]:
    """The budget's own figures: `estimate_usd` as an enqueue fixes it (online), and the same
    formula at the batch discount."""
    online = sum(to_row(s, None, settings.prices)["estimate_usd"] for s in specs)
    batch = 0.0
    for s in specs:
        row = to_row(s)
        size = input_bytes(row["input"])
        batch += settings.prices.worst_case(s.provider, s.model, size, s.params, batch=True) or 0.0
    return online, batch


def test_the_example_evaluation_is_estimated_by_the_budgets_formula_writes_nothing_and_counts_cache_hits(
    db_url: str,
) -> None:
    with running_mock_provider(batch_latency=0.2) as mock:
        settings = batch_settings(db_url, mock)
        Store(db_url).close()  # an existing ledger, empty
        before = snapshot(db_url)
        said = estimated(db_url, "eval", str(EXAMPLE_SPEC))
        assert snapshot(db_url) == before  # nothing written
        spec = load_spec(EXAMPLE_SPEC)
        specs = first_requests(spec, settings)
        online, batch = worst_cases(settings, specs)
        assert (said["requests"], said["cache_hits"]) == (len(specs), 0) == (30, 0)
        assert said["worst_case_usd"]["online"] == pytest.approx(online) and online > 0
        assert said["worst_case_usd"]["batch"] == pytest.approx(batch) and batch < online
        (model,) = said["by_model"]
        assert (model["provider"], model["model"], model["requests"]) == ("openai", "gpt-4o-mini", 30)
        assert model["max_output_tokens"] == said["max_output_tokens"] == sum(s.params["max_tokens"] for s in specs)

        store = Store(db_url)
        trigger(store, settings, spec)
        run(settings)
        store.close()
        again = estimated(db_url, "eval", str(EXAMPLE_SPEC))
    assert (again["requests"], again["cache_hits"]) == (30, 30)  # every answer is already held: free
    assert again["worst_case_usd"] == {"online": 0.0, "batch": 0.0} and again["input_tokens"] == 0


def test_a_jsonl_file_is_estimated_per_model_writes_nothing_and_counts_the_answers_already_held(
    db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "r.jsonl"
    lines = [
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"q {i}"}], "max_tokens": 50 + i}
        for i in range(6)
    ] + [{"model": "gpt-4o", "messages": [{"role": "user", "content": "big question " * 40}]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with running_mock_provider() as mock:
        settings = batch_settings(db_url, mock)
        missing = tmp_path / "none.db"
        said = estimated(f"sqlite:///{missing}", "enqueue", str(path))
        assert not missing.exists()  # an estimate never creates a ledger
        specs = [s for _, s in read_jsonl_file(path, Defaults())]
        online, batch = worst_cases(settings, specs)
        assert said["requests"] == 7 and said["cache_hits"] == 0
        assert said["worst_case_usd"]["online"] == pytest.approx(online)
        assert said["worst_case_usd"]["batch"] == pytest.approx(batch)
        assert [(m["model"], m["requests"]) for m in said["by_model"]] == [("gpt-4o", 1), ("gpt-4o-mini", 6)]
        assert said["by_model"][1]["max_output_tokens"] == sum(50 + i for i in range(6))

        first = tmp_path / "first.jsonl"  # three of the lines answered already
        first.write_text("".join(json.dumps(line) + "\n" for line in lines[:3]))
        assert CliRunner().invoke(app, ["enqueue", str(first)], env={"LEDGER_DATABASE_URL": db_url}).exit_code == 0
        run(settings)
        before = snapshot(db_url)
        again = estimated(db_url, "enqueue", str(path))
        assert snapshot(db_url) == before
    assert again["cache_hits"] == 3 and again["by_model"][1]["cache_hits"] == 3
    rest, _ = worst_cases(settings, specs[3:])
    assert again["worst_case_usd"]["online"] == pytest.approx(rest)  # the held answers cost nothing


def test_an_estimate_with_a_bad_line_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"model": "gpt-4o-mini", "messages": []}\n')
    result = CliRunner().invoke(
        app, ["enqueue", str(path), "--estimate"], env={"LEDGER_DATABASE_URL": f"sqlite:///{tmp_path}/l.db"}
    )
    assert result.exit_code == 2 and f"{path}:1:" in result.output
    assert not (tmp_path / "l.db").exists()
