"""Evaluation jobs end to end on both databases: the real OpenAI SDK against the mock server."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.answers import chat_answer
from ledger.api import Ledger
from ledger.cli import app
from ledger.evaluation import FAILED_ARGUMENT
from ledger.jobs import TriggerRefused, reparse, trigger
from ledger.parsing import parse_verdict
from ledger.settings import Settings
from ledger.spec import JobSpec, load_spec, spec_from_mapping
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, run
from tests.integration.store_helpers import LogRecords, event_lines, kept_records, logged

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eval" / "spec.toml"


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider() as server:
        yield server


def small_spec(job_id: str, *, system: str = "You are a careful judge.", dims: int = 10, **top: Any) -> JobSpec:
    data: dict[str, Any] = {
        "id": job_id,
        "artifact": {"text": "def add(a, b):\n    return a - b\n"},
        "agents": [{"name": "judge", "provider": "openai", "model": "gpt-4o-mini", "system": system}],
        "dimensions": [
            {"id": f"d{i:02d}", "name": f"Dimension {i}", "instruction": f"Rate aspect {i}."} for i in range(dims)
        ],
        **top,
    }
    return spec_from_mapping(data, source="test", base_dir=Path("."), default_id=job_id)


def expected_scores(store: Store, job_id: str) -> dict[tuple[str, str], int | None]:
    """What the mock answers each single-dimension request, parsed: computed, not hard-coded."""
    found = {}
    for row in store.list_requests(job_id=job_id, limit=1000):
        full = store.get_request(row["id"])
        assert full is not None
        trace = full["trace"]
        if trace["mode"] != "single":
            continue
        answer = chat_answer(full["model"], full["input"]["system"], full["input"]["messages"], None)
        found[(trace["agent"], trace["dimension"])] = parse_verdict(answer.text).score
    return found


@pytest.fixture
def captured() -> Iterator[LogRecords]:
    with event_lines() as lines:
        yield lines


def opinion_map(store: Store, job_id: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["agent"], o["dimension"]): o for o in store.opinions(job_id)}


def test_example_spec_per_dimension_end_to_end(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    spec = load_spec(EXAMPLE)
    store = Store(db_url)
    staged = trigger(store, settings, spec)
    assert (staged.created, staged.requests) == (True, 30)
    again = trigger(store, settings, spec)
    assert (again.created, again.requests) == (False, 30)  # re-triggering adds nothing
    run(settings)
    job = store.get_job(spec.id)
    assert job is not None and job["status"] == "completed" and not job["errors"]
    opinions = opinion_map(store, spec.id)
    assert len(opinions) == 30
    expected = expected_scores(store, spec.id)
    assert {k: o["score"] for k, o in opinions.items()} == expected
    assert all(score is not None for score in expected.values())
    assert mock.stats()["calls"] == 30
    # Derived fields sit beside the raw output, which is kept as it came.
    request = store.get_request(next(iter(opinions.values()))["request_id"])
    assert request is not None and request["raw_output"].rstrip().endswith(request["verdict_text"])
    assert request["parsed_verdict"] == next(iter(opinions.values()))["score"] and request["parsed_at"] is not None


def test_structured_batching_three_requests(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True)
    spec = load_spec(EXAMPLE)
    store = Store(db_url)
    assert trigger(store, settings, spec).requests == 3
    run(settings)
    assert store.get_job(spec.id)["status"] == "completed"  # type: ignore[index]
    opinions = opinion_map(store, spec.id)
    assert len(opinions) == 30 and mock.stats()["calls"] == 3
    for row in store.list_requests(job_id=spec.id):
        full = store.get_request(row["id"])
        assert full is not None
        answer = json.loads(
            chat_answer(full["model"], full["input"]["system"], full["input"]["messages"], full["response_format"]).text
        )
        for entry in answer["evaluations"]:
            assert opinions[(full["trace"]["agent"], entry["criterion_id"])]["score"] == entry["score"]


def test_partial_structured_answer_retries_only_the_missing(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True)
    store = Store(db_url)
    trigger(store, settings, small_spec("partial", system="Judge. [[mock:omit=2]]"))
    run(settings)
    singles = [r for r in store.list_requests(job_id="partial") if r["idempotency_key"] != "partial:judge:*"]
    assert [r["idempotency_key"] for r in singles] == ["partial:judge:d08", "partial:judge:d09"]
    assert len(opinion_map(store, "partial")) == 10
    assert store.get_job("partial")["status"] == "completed"  # type: ignore[index]


def test_corrupt_entry_is_logged_and_retried_alone(
    db_url: str, mock: RunningMockProvider, captured: LogRecords
) -> None:
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True)
    store = Store(db_url)
    trigger(store, settings, small_spec("corrupt", system="Judge. [[mock:corrupt=1]]"))
    run(settings)
    rejected = logged(captured, "entry_rejected")
    assert len(rejected) == 1
    assert rejected[0]["level"] == "WARNING" and '"criterion_id":"d00"' in rejected[0]["raw"]
    keys = [r["idempotency_key"] for r in store.list_requests(job_id="corrupt")]
    singles = [key for key in keys if not key.endswith("*")]
    assert singles == ["corrupt:judge:d00"]
    assert len(opinion_map(store, "corrupt")) == 10


def test_persistent_failure_gives_a_failed_opinion_and_the_job_completes(
    db_url: str, mock: RunningMockProvider, captured: LogRecords
) -> None:
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    trigger(store, settings, small_spec("failing", system="Judge. [[mock:fail=503x*]]", dims=2))
    run(settings)
    job = store.get_job("failing")
    assert job is not None and job["status"] == "completed" and len(job["errors"]) == 2
    for opinion in opinion_map(store, "failing").values():
        assert opinion["score"] is None
        assert opinion["argument"] == FAILED_ARGUMENT.format(n=settings.retry_max_attempts)
    failed = logged(captured, "evaluation_failed")
    assert sorted(f["dimension"] for f in failed) == ["d00", "d01"]
    assert all(f["status_code"] == 503 and f["agent"] == "judge" and f["elapsed_s"] >= 0 for f in failed)


def test_reparse_reproduces_opinions_without_calls(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True)
    store = Store(db_url)
    trigger(store, settings, small_spec("again", system="Judge. [[mock:omit=3]]"))
    run(settings)
    before = {k: (o["score"], o["argument"], o["request_id"]) for k, o in opinion_map(store, "again").items()}
    calls = mock.stats()["calls"]
    assert reparse(store, "again") == 10
    after = {k: (o["score"], o["argument"], o["request_id"]) for k, o in opinion_map(store, "again").items()}
    assert after == before and mock.stats()["calls"] == calls


def test_capacity_and_budget_refusals(db_url: str, mock: RunningMockProvider) -> None:
    settings: Settings = batch_settings(db_url, mock, LEDGER_JOB_CAPACITY=1)
    store = Store(db_url)
    trigger(store, settings, small_spec("first", dims=1))
    with pytest.raises(TriggerRefused, match=r"^Cannot trigger: at capacity \(1 active jobs, limit is 1\)$"):
        trigger(store, settings, small_spec("second", dims=1))
    assert store.get_job("second") is None and not store.list_requests(job_id="second")
    broke = batch_settings(db_url, mock, LEDGER_DAILY_BUDGET_USD=0)
    with pytest.raises(TriggerRefused, match=r"^Cannot trigger: budget exhausted \(\$0\.00 of \$0\.00 spent today\)$"):
        trigger(store, broke, small_spec("third", dims=1))


def test_python_api_trigger_then_wait_from_another_thread(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    data = {
        "id": "api",
        "artifact": {"text": "print('hi')"},
        "agents": [{"name": "judge", "provider": "openai", "model": "gpt-4o-mini", "system": "Judge."}],
        "dimensions": [{"id": "clarity", "name": "Clarity", "instruction": "Is it clear?"}],
    }
    with Ledger(settings=settings) as ledger:
        assert ledger.trigger(data).created
        with pytest.raises(TimeoutError, match="job 'api': 1 request"):
            ledger.wait("api", timeout=0.2)  # no daemon: nothing moves
        daemon = threading.Thread(target=run, args=(settings,))
        daemon.start()
        rows = ledger.wait("api", timeout=60)
        daemon.join()
        assert [r["status"] for r in rows] == ["completed"]
        assert rows[0]["parsed_verdict"] == store_score(ledger.store, "api") and rows[0]["reasoning"]
        again = anyio.run(lambda: ledger.await_results([rows[0]["id"]], timeout=5))
        assert again == rows


def store_score(store: Store, job_id: str) -> int | None:
    (opinion,) = store.opinions(job_id)
    return opinion["score"]  # type: ignore[no-any-return]


def test_a_job_whose_budget_cannot_pay_ends_failed_and_others_go_on(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    # gpt-4o-mini's worst case with max_tokens unset (4096 output tokens) is ~$0.0025 a request.
    trigger(store, settings, small_spec("poor", dims=3, budget_usd=0.001))
    trigger(store, settings, small_spec("rich", dims=3))
    run(settings)
    poor, rich = store.get_job("poor"), store.get_job("rich")
    assert poor is not None and poor["status"] == "failed" and poor["error"].startswith("budget exhausted")
    assert {r["status"] for r in store.list_requests(job_id="poor")} == {"canceled"}
    assert rich is not None and rich["status"] == "completed" and len(store.opinions("rich")) == 3
    assert mock.stats()["calls"] == 3  # nothing was spent on the poor job


def test_a_batch_delivery_job_goes_through_one_provider_batch(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    trigger(store, settings, small_spec("viabatch", dims=4, delivery="batch"))
    run(settings)
    assert store.get_job("viabatch")["status"] == "completed"  # type: ignore[index]
    opinions = opinion_map(store, "viabatch")
    assert {k: o["score"] for k, o in opinions.items()} == expected_scores(store, "viabatch")
    assert mock.stats()["batch_creates"] == {"openai": 1} and mock.stats()["calls"] == 0
    assert all(r["cost_usd"] for r in store.request_results(job_id="viabatch"))


def test_a_batch_job_attaches_only_what_its_budget_can_pay_for(db_url: str, mock: RunningMockProvider) -> None:
    """An attach reserves like a claim: the first batch holds only the requests whose worst case
    fits the job's budget; the rest wait for later batches, paid from what is left."""
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    spec = small_spec("thrifty", dims=6, delivery="batch", budget_usd=0.004)
    trigger(store, settings, spec)
    estimates = sorted(r["estimate_usd"] for r in rows_of(store, "thrifty"))
    affordable = max(n for n in range(7) if sum(estimates[:n]) <= 0.004)
    assert 1 <= affordable < 6  # the budget holds some of the job, not all of it
    run(settings)
    with store.engine.connect() as conn:
        first = conn.execute(text("SELECT request_total FROM llm_batches ORDER BY id LIMIT 1")).scalar_one()
    assert first == affordable
    assert store.get_job("thrifty")["status"] == "completed"  # type: ignore[index]
    assert sum(r["cost_usd"] for r in store.request_results(job_id="thrifty")) <= 0.004


def rows_of(store: Store, job_id: str) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        found = conn.execute(text("SELECT id, estimate_usd FROM llm_requests WHERE job_id = :j"), {"j": job_id})
        return [dict(r._mapping) for r in found]


@pytest.mark.parametrize("delivery", ["online", "batch"])
def test_a_request_dearer_than_the_whole_daily_budget_fails_its_job_instead_of_hanging(
    db_url: str, mock: RunningMockProvider, delivery: str
) -> None:
    # gpt-4o-mini's worst case with max_tokens unset is ~$0.0025; the day allows $0.001.
    settings = batch_settings(db_url, mock, LEDGER_DAILY_BUDGET_USD=0.001)
    store = Store(db_url)
    trigger(store, settings, small_spec("dear", dims=2, delivery=delivery))
    run(settings)  # returns: the job ended, nothing is left to wait for
    job = store.get_job("dear")
    assert job is not None and job["status"] == "failed" and "more than the daily budget" in job["error"]
    assert mock.stats()["calls"] == 0 and not mock.stats()["batch_creates"]


def test_reparse_waits_for_the_job_to_end_and_waiting_for_an_unknown_job_says_so(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    trigger(store, settings, small_spec("busy", dims=1))
    with pytest.raises(ValueError, match="still running"):
        reparse(store, "busy")
    with Ledger(settings=settings) as ledger, pytest.raises(LookupError, match="no job 'nope'"):
        ledger.wait("nope", timeout=1)


def test_an_until_idle_run_with_a_job_and_its_gaps_ends_on_events_not_polls(
    db_url: str, mock: RunningMockProvider
) -> None:
    """Polls an hour apart: the gap requests a job step queues are claimed at once, and the run
    ends when the job does (run's deadline: 60 s)."""
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True, LEDGER_POLL_INTERVAL=3600)
    store = Store(db_url)
    trigger(store, settings, small_spec("events", system="Judge. [[mock:omit=2]]"))
    run(settings)
    assert store.get_job("events")["status"] == "completed"  # type: ignore[index]
    assert len(opinion_map(store, "events")) == 10
    assert len(store.list_requests(job_id="events")) == 3  # the structured request and two gaps


def test_a_judge_cut_off_at_max_tokens_is_flagged_and_counted_while_the_job_runs(
    db_url: str, mock: RunningMockProvider
) -> None:
    """A judge whose max_tokens is too small: every opinion says the answer was cut off (not "no
    VERDICT line" alone), `ledger status --json` counts them while the job runs, `ledger report`
    after. The second judge's calls are held at the mock, so the job is certainly still running."""
    from typer.testing import CliRunner

    from ledger.cli import app
    from ledger.cli_jobs import job_status

    settings = batch_settings(db_url, mock)
    judge = {"provider": "openai", "model": "gpt-4o-mini"}
    spec = small_spec("terse", dims=3)
    data = {
        "id": "terse",
        "artifact": {"text": "def add(a, b):\n    return a - b\n"},
        "agents": [
            {**judge, "name": "terse", "system": "You judge.", "params": {"max_tokens": 5}},
            {**judge, "name": "held", "system": "You judge. [[mock:hold]]"},
        ],
        "dimensions": [{"id": d.id, "name": d.name, "instruction": d.instruction} for d in spec.dimensions],
    }
    store = Store(db_url)
    trigger(store, settings, spec_from_mapping(data, source="test", base_dir=Path("."), default_id="terse"))
    daemon = threading.Thread(target=run, args=(settings,))
    daemon.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            (active,) = job_status(store, settings)["active_jobs"]
            if active["truncated"] == 3:
                break
            assert time.monotonic() < deadline, f"truncated answers not counted: {active}"
            time.sleep(0.05)
        said = CliRunner().invoke(app, ["status", "--json"], env={"LEDGER_DATABASE_URL": db_url})
        assert said.exit_code == 0, said.output
        assert json.loads(said.stdout)["active_jobs"][0]["truncated"] == 3
    finally:
        mock.release()
        daemon.join()
    opinions = {(o["agent"], o["dimension"]): o for o in store.opinions("terse")}
    assert len(opinions) == 6
    for (agent, _), opinion in opinions.items():
        if agent == "terse":
            assert opinion["score"] is None
            assert opinion["parse_error"] == "answer cut off at max_tokens (5): no VERDICT line"
        else:
            assert opinion["score"] is not None and opinion["parse_error"] is None
    report = CliRunner().invoke(app, ["report", "terse"], env={"LEDGER_DATABASE_URL": db_url})
    assert report.exit_code == 0, report.output
    assert "3 answers cut off at max_tokens" in report.stdout.splitlines()


def test_a_rerun_under_a_new_id_pays_only_for_what_changed(db_url: str, mock: RunningMockProvider) -> None:
    """The example evaluation again under a new id with one judge's persona changed: 10 calls, 30
    opinions; again unchanged under a third id: no call, 30 opinions (the response cache)."""
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    first = replace(load_spec(EXAMPLE), id="cache-run-1")
    trigger(store, settings, first)
    run(settings)
    assert mock.stats()["calls"] == 30
    changed = replace(
        first,
        id="cache-run-2",
        agents=(replace(first.agents[0], system="You are a terse reviewer."), *first.agents[1:]),
    )
    trigger(store, settings, changed)
    run(settings)
    assert mock.stats()["calls"] == 40
    trigger(store, settings, replace(first, id="cache-run-3"))
    run(settings)
    assert mock.stats()["calls"] == 40
    for job_id in ("cache-run-2", "cache-run-3"):
        job = store.get_job(job_id)
        assert job is not None and job["status"] == "completed"
        opinions = opinion_map(store, job_id)
        assert len(opinions) == 30 and all(o["score"] is not None for o in opinions.values())
    # The copies' opinions are the originals' scores; only the changed judge's are new answers.
    before, after = opinion_map(store, "cache-run-1"), opinion_map(store, "cache-run-3")
    assert {k: o["score"] for k, o in before.items()} == {k: o["score"] for k, o in after.items()}
    copied = [store.get_request(o["request_id"]) for o in opinion_map(store, "cache-run-2").values()]
    assert sum(1 for r in copied if r is not None and r["cached_from"] is not None) == 20
    store.close()


def test_samples_ask_every_cell_n_times_and_the_report_shows_means(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    store = Store(db_url)
    spec = replace(load_spec(EXAMPLE), id="sampled", samples=3)
    staged = trigger(store, settings, spec)
    assert staged.requests == 90
    run(settings)
    assert mock.stats()["calls"] == 90  # each sample is its own question: none answered from another
    opinions = store.opinions("sampled")
    assert len(opinions) == 90
    assert sorted({o["sample"] for o in opinions}) == [0, 1, 2]
    report = CliRunner().invoke(app, ["report", "sampled"], env={"LEDGER_DATABASE_URL": db_url}, terminal_width=400)
    assert report.exit_code == 0, report.output
    assert "(3 samples a cell)" in report.output
    agent, dimension = spec.agents[0].name, spec.dimensions[0].id
    scores = [o["score"] for o in opinions if (o["agent"], o["dimension"]) == (agent, dimension)]
    assert len(scores) == 3 and f"{sum(scores) / 3:.2f} (n=3," in report.output
    as_json = CliRunner().invoke(app, ["report", "sampled", "--json"], env={"LEDGER_DATABASE_URL": db_url})
    assert sorted({json.loads(line)["sample"] for line in as_json.output.splitlines()}) == [0, 1, 2]
    store.close()


@pytest.mark.parametrize("delivery", ["online", "batch"])
def test_the_example_evaluation_with_judges_on_three_providers_uses_each_ones_structured_output(
    db_url: str, mock: RunningMockProvider, delivery: str
) -> None:
    settings = batch_settings(db_url, mock, BATCHING_ENABLED=True)
    spec = load_spec(EXAMPLE)
    models = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
    agents = tuple(
        replace(agent, provider=provider, model=model)
        for agent, (provider, model) in zip(spec.agents, models.items(), strict=True)
    )
    spec = replace(spec, id=f"three-providers-{delivery}", agents=agents, delivery=delivery)
    store = Store(db_url)
    with kept_records("ledger.enqueue", logging.WARNING) as warned:
        assert trigger(store, settings, spec).requests == 3  # one structured request per judge
    assert [r.getMessage() for r in warned.records] == ["anthropic takes no temperature: left out of 1 request(s)"]
    run(settings)

    assert store.get_job(spec.id)["status"] == "completed"  # type: ignore[index]
    opinions = opinion_map(store, spec.id)
    assert len(opinions) == 30 and all(o["score"] is not None for o in opinions.values())
    requests = {r["provider"]: store.get_request(r["id"]) for r in store.list_requests(job_id=spec.id)}
    assert sorted(requests) == ["anthropic", "gemini", "openai"]
    for provider, row in requests.items():
        assert row is not None and row["delivery"] == delivery
        # The mock answers with a conforming instance only when it finds the schema where the
        # provider's API takes it (output_config.format, responseJsonSchema, response_format).
        assert len(json.loads(row["raw_output"])["evaluations"]) == 10, provider
        assert row["dropped_params"] == (["temperature"] if provider == "anthropic" else None)
        assert row["params"] == {"temperature": 0, "max_tokens": 400}
    store.close()
