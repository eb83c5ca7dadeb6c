"""Gemini (both databases, the real `google-genai` SDK against the mock's Gemini wire): Gemini's own
batch-input lines at enqueue, any stored request replayed on Gemini, the example evaluation with a
Gemini judge (structured batching included), and its quotas: a per-day quota spent pauses the pool
until the provider's daily reset, a per-minute 429 is retried after its RetryInfo delay.

Every answer kind, online and in batches, with its cost from a written price file, is in
`test_whole_answers.py`; expiry in `test_provider_batches.py`; the crash window in the acceptance
tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from ledger.api import Ledger
from ledger.cli import app
from ledger.enqueue import build_spec
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, example_with_judge, requests_t, rows, run
from tests.integration.store_helpers import event_lines, logged

MODEL = "gemini-2.5-flash"


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def stored(db_url: str) -> list[dict[str, Any]]:
    store = Store(db_url)
    try:
        return rows(store, requests_t)
    finally:
        store.close()


def gemini_line(key: str, text: str, **request: Any) -> str:
    body = {"contents": [{"role": "user", "parts": [{"text": text}]}], **request}
    return json.dumps({"key": key, "request": body})


def test_gemini_batch_lines_are_enqueued_in_the_ledgers_words_and_answered(
    db_url: str, mock: RunningMockProvider, tmp_path: Path
) -> None:
    schema = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}}}
    config = {
        "temperature": 0.2,
        "max_output_tokens": 300,  # Gemini's JSON takes proto names too
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
        "thinkingConfig": {"thinkingBudget": 0},
    }
    path = tmp_path / "gemini.jsonl"
    path.write_text(
        "\n".join(
            [
                gemini_line("g-1", "Score this answer.", systemInstruction={"parts": [{"text": "You grade."}]}),
                gemini_line("g-2", "And this one.", generationConfig=config),
            ]
        )
        + "\n"
    )
    settings = batch_settings(db_url, mock)
    env = {"LEDGER_DATABASE_URL": db_url}
    said = CliRunner().invoke(app, ["enqueue", str(path), "--model", MODEL], env=env)
    assert said.exit_code == 0, said.output
    first, second = stored(db_url)
    assert (first["provider"], first["model"], first["endpoint"]) == ("gemini", MODEL, f"gemini:{MODEL}")
    assert first["idempotency_key"] == "g-1" and first["input"]["system"] == "You grade."
    assert first["input"]["messages"] == [{"role": "user", "content": "Score this answer."}]
    # generationConfig in the ledger's vocabulary; what has no counterpart keeps Gemini's name.
    assert second["params"] == {"temperature": 0.2, "max_tokens": 300, "thinkingConfig": {"thinkingBudget": 0}}
    assert second["response_format"]["json_schema"]["schema"] == schema
    run(settings)
    first, second = stored(db_url)
    assert first["status"] == second["status"] == "completed"
    assert mock.server.stats()["calls"] == 2
    assert 1 <= json.loads(second["raw_output"])["score"] <= 5  # the schema reached Gemini
    assert "VERDICT:" in first["raw_output"] and first["response"]["candidates"]


def test_a_bad_gemini_line_is_one_line_naming_it_and_nothing_is_written(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(gemini_line("ok", "fine") + "\n" + json.dumps({"key": "bad", "request": {"contents": "hi"}}) + "\n")
    said = CliRunner().invoke(app, ["enqueue", str(path), "--model", MODEL], env={"LEDGER_DATABASE_URL": db_url})
    assert said.exit_code != 0
    assert "bad.jsonl:2: request.contents must be a list" in said.output
    assert len(said.output.strip().splitlines()) == 1
    assert stored(db_url) == []


def test_any_stored_request_goes_to_gemini_with_provider_gemini(
    db_url: str, mock: RunningMockProvider, tmp_path: Path
) -> None:
    path = tmp_path / "chat.jsonl"
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Rate it."}],
        "max_tokens": 200,
        "stop": "END",
    }
    path.write_text(json.dumps({"custom_id": "c-1", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    env = {"LEDGER_DATABASE_URL": db_url}
    said = CliRunner().invoke(app, ["enqueue", str(path), "--provider", "gemini", "--model", MODEL], env=env)
    assert said.exit_code == 0, said.output
    run(batch_settings(db_url, mock))
    (row,) = stored(db_url)
    assert row["status"] == "completed" and row["provider"] == "gemini"
    assert row["finish_reason"] == "stop" and row["output_tokens"] and row["cost_usd"]


def test_the_example_evaluation_runs_with_a_gemini_judge_structured_batching_included(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True)
    store, spec = example_with_judge(settings, "gemini", MODEL, "gemini-eval")
    gemini_rows = [r for r in store.list_requests(job_id="gemini-eval", limit=100) if r["provider"] == "gemini"]
    # Structured batching: the Gemini judge asked for every dimension at once, against a JSON schema.
    (row,) = gemini_rows
    full = store.get_request(row["id"])
    assert full is not None and full["response_format"]["type"] == "json_schema"
    assert len(json.loads(full["raw_output"])["evaluations"]) == len(spec.dimensions) == 10
    assert mock.server.stats()["calls"] == 3  # one request per judge
    store.close()


def refused(mock: RunningMockProvider) -> int:
    return int(mock.server.stats()["status_counts"].get("quota", 0))


def day_ends(db_url: str, pool: str) -> None:
    """Midnight in Los Angeles has come, as far as the ledger can tell: the pause's end is past."""
    store = Store(db_url)
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE llm_pools SET cooldown_until = :past WHERE endpoint = :pool"),
            {"past": datetime(2000, 1, 1), "pool": pool},
        )
    store.close()


def test_a_spent_daily_quota_pauses_the_pool_until_midnight_in_los_angeles(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock, MAX_CONCURRENT_LLM_CALLS=2)
    pool = f"gemini:{MODEL}"
    mock.spend_quota(MODEL)
    with event_lines() as captured:
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(
                build_spec(
                    provider=provider, model=model, messages=[{"role": "user", "content": f"q{i}"}], idempotency_key=k
                )
                for i in range(100)
                for provider, model, k in (("gemini", MODEL, f"g{i}"), ("openai", "gpt-4o", f"o{i}"))
                if provider == "gemini" or i < 20
            )
        before = datetime.now(UTC)
        run(settings)  # until idle: what is left waits only for the paused pool
        found = stored(db_url)
        assert all(r["status"] == "completed" for r in found if r["provider"] == "openai")  # another pool went on
        paused = [r for r in found if r["provider"] == "gemini"]
        assert len(paused) == 100 and all(r["status"] == "queued" and r["attempts"] == r["parked"] for r in paused)
        at_pause = refused(mock)
        assert at_pause <= 2  # only the calls out when it was refused
        usage = Store(db_url).pool_usage()[pool]
        midnight = (before.astimezone(ZoneInfo("America/Los_Angeles")) + timedelta(days=1)).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
        until = usage["cooldown_until"]
        until = until if until.tzinfo else until.replace(tzinfo=UTC)
        assert abs((until - midnight).total_seconds()) < 60
        assert "daily quota exhausted (GenerateRequestsPerDayPerProjectPerModel)" in usage["paused_reason"]
        (pause,) = logged(captured, "quota_exhausted")
        assert pause["pool"] == pool and pause["provider"] == "gemini"

        day_ends(db_url, pool)  # the quota is still spent: one request probes, and the pool pauses again
        run(settings)
        assert refused(mock) == at_pause + 1 and len(logged(captured, "quota_exhausted")) == 2
        assert Store(db_url).pool_usage()[pool]["paused_until"] is not None

        mock.spend_quota(MODEL, spent=False)  # a new day at Google
        day_ends(db_url, pool)
        run(settings)
    found = [r for r in stored(db_url) if r["provider"] == "gemini"]
    assert all(r["status"] == "completed" and r["attempts"] - r["parked"] == 1 for r in found)  # none ended `error`
    assert refused(mock) == at_pause + 1


def test_ledger_pools_resume_lifts_a_daily_pause_at_once(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    pool = f"gemini:{MODEL}"
    mock.spend_quota(MODEL)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue(provider="gemini", model=MODEL, messages=[{"role": "user", "content": "q"}])
    run(settings)
    assert stored(db_url)[0]["status"] == "queued"
    mock.spend_quota(MODEL, spent=False)
    env = {"LEDGER_DATABASE_URL": db_url}
    resumed = CliRunner().invoke(app, ["pools", "resume", pool], env=env)
    assert resumed.exit_code == 0 and f"pool {pool} resumed" in resumed.output
    run(settings)
    assert stored(db_url)[0]["status"] == "completed"


def test_a_per_minute_429_is_retried_after_its_retry_info_delay(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, RETRY_MAX_ATTEMPTS=3)
    with event_lines() as captured:
        with Ledger(settings=settings) as ledger:
            ledger.enqueue(
                provider="gemini",
                model=MODEL,
                messages=[{"role": "user", "content": "[[mock:fail=429x1]] [[mock:retry_after=0.3]] go"}],
            )
        run(settings)
    (row,) = stored(db_url)
    # Its 429 was waited out (counted in `parked`, for no retry limit), not a quota pause (below).
    assert row["status"] == "completed" and row["attempts"] == 2 and row["parked"] == 1
    (retry,) = logged(captured, "retry")
    assert retry["status_code"] == 429 and retry["delay_s"] >= 0.3  # no sooner than RetryInfo said
    assert logged(captured, "quota_exhausted") == []
