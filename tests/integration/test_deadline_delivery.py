"""Delivery `auto`: a provider batch at the discount, finished online by the deadline. The real SDKs
against the mock provider (which holds a batch unfinished and cancels it with a partial output, as
the providers do), on both databases."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.answers import chat_answer
from ledger.api import Ledger
from ledger.cli import app
from ledger.enqueue import build_spec
from ledger.jobs import trigger
from ledger.settings import Settings
from ledger.spec import load_spec
from ledger.store import Store
from ledger.web import WebConfig, create_app
from tests.integration.batch_helpers import EXAMPLE_SPEC, attempts_t, batch_settings, batches_t, requests_t, rows, run

MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}


@pytest.fixture
def held() -> Iterator[RunningMockProvider]:
    """A batch answers 2 % of its lines a second: one canceled a few seconds in has answered a few."""
    with running_mock_provider(batch_latency=50.0) as server:
        yield server


def enqueue_auto(
    settings: Settings, n: int, provider: str, deadline: str | None, name: str = "r", job_id: str | None = None
) -> None:
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(
            build_spec(
                model=MODELS.get(provider, "local-model"),
                provider=provider,
                messages=[{"role": "user", "content": f"{name} {i}"}],
                delivery="auto",
                deadline=deadline,
                idempotency_key=f"{name}-{i}",
                job_id=job_id,
            )
            for i in range(n)
        )


def utc(when: datetime) -> datetime:
    """A timestamp as read back (SQLite's without a zone: it is UTC)."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def answered_once(store: Store) -> dict[int, Any]:
    """Every request completed with its own answer, one result each; its attempts by outcome."""
    by_request: dict[int, Counter[tuple[str, str | None]]] = {}
    for a in rows(store, attempts_t):
        by_request.setdefault(a["request_id"], Counter())[(a["outcome"], a["error_code"])] += 1
    for r in rows(store, requests_t):
        expected = chat_answer(r["model"], None, r["input"]["messages"], None)
        assert r["status"] == "completed" and r["raw_output"] == expected.text
        results = sum(n for (outcome, code), n in by_request[r["id"]].items() if outcome == "succeeded" and not code)
        assert results == 1, by_request[r["id"]]  # a late batch answer is `answered_late`, not a result
    return by_request


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_a_batch_not_finished_by_the_margin_is_canceled_and_the_rest_finishes_online_before_the_deadline(
    db_url: str, held: RunningMockProvider, provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = batch_settings(db_url, held, LEDGER_DEADLINE_MARGIN_SECONDS=20)
    enqueue_auto(settings, 200, provider, "30s", job_id="j")  # a daemon takes some seconds to start and submit
    with caplog.at_level(logging.WARNING, logger="ledger.events"):
        run(settings)

    store = Store(db_url)
    assert held.stats()["batch_creates"] == {provider: 1}  # all 200 went into one batch
    (batch,) = rows(store, batches_t)
    assert batch["status"] == "canceled" and batch["fallback_at"] is not None and batch["request_total"] == 200
    answered_once(store)
    requests = rows(store, requests_t)
    via = Counter(r["answered_via"] for r in requests)
    assert via["batch"] > 0 and via["online"] > 0 and via["batch"] + via["online"] == 200
    assert all(r["completed_at"] <= r["deadline"] for r in requests)
    price = settings.prices.price(provider, MODELS[provider])
    assert price is not None and price.batch_discount > 0
    for r in requests:  # batch answers at the discount, online ones at the full price
        batch_priced = r["answered_via"] == "batch"
        assert r["cost_usd"] == pytest.approx(price.cost(r["input_tokens"], r["output_tokens"], batch=batch_priced))
        assert (r["batch_id"] is not None) == batch_priced and r["delivery"] == ("batch" if batch_priced else "online")
    moved = [m.event_fields for m in caplog.records if m.getMessage() == "deadline_fallback"]  # type: ignore[attr-defined]
    assert sum(e["requests"] for e in moved) == via["online"]
    assert {e["pool"] for e in moved} == {f"{provider}:{MODELS[provider]}"}
    seen_in_status_export_and_show(db_url, requests, price.batch_discount, via)
    with TestClient(create_app(store, settings, WebConfig(hosts=frozenset({"testserver"})))) as web:
        page = web.get("/jobs/j").text  # the job page: its cost, what batches saved, how answered
    assert "saved by provider batches" in page
    assert f"{via['batch']} via batch" in page and f"{via['online']} via online" in page
    store.close()


def seen_in_status_export_and_show(
    db_url: str, requests: list[dict[str, Any]], discount: float, via: Counter[str]
) -> None:
    """`status --json --job`, `export` and `show` say how each was answered, its deadline, and
    what the batch saved."""
    env = {"LEDGER_DATABASE_URL": db_url}
    said = json.loads(CliRunner().invoke(app, ["status", "--json", "--job", "j"], env=env).stdout)["job"]
    assert said["answered_via"] == {"batch": via["batch"], "online": via["online"]} and said["late"] == 0
    assert utc(datetime.fromisoformat(said["deadline"])) == utc(requests[0]["deadline"])
    spent = sum(r["cost_usd"] for r in requests)
    batch_cost = sum(r["cost_usd"] for r in requests if r["answered_via"] == "batch")
    assert said["cost_usd"] == pytest.approx(spent, abs=1e-6)
    assert said["saved_usd"] == pytest.approx(batch_cost / (1 - discount) - batch_cost, abs=1e-6)
    assert said["all_online_usd"] == pytest.approx(said["cost_usd"] + said["saved_usd"], abs=1e-6)
    exported = CliRunner().invoke(app, ["export", "--job", "j"], env=env).stdout.splitlines()
    by_id = {r["id"]: r for r in requests}
    for line in map(json.loads, exported):
        assert line["answered_via"] == by_id[line["id"]]["answered_via"]
        assert utc(datetime.fromisoformat(line["deadline"])) == utc(by_id[line["id"]]["deadline"])
    shown = CliRunner().invoke(app, ["show", str(requests[0]["id"])], env=env).stdout
    assert f"answered_via: {requests[0]['answered_via']}" in shown and "deadline: " in shown


def test_a_batch_that_finishes_in_time_answers_everything_at_the_discount_and_nothing_goes_online(
    db_url: str,
) -> None:
    with running_mock_provider(batch_latency=0.2) as mock:
        settings = batch_settings(db_url, mock)
        enqueue_auto(settings, 50, "anthropic", "2h")
        run(settings)
        stats = mock.stats()
    store = Store(db_url)
    assert stats["batch_creates"] == {"anthropic": 1}
    (batch,) = rows(store, batches_t)
    assert batch["status"] == "completed" and batch["fallback_at"] is None
    answered_once(store)
    price = settings.prices.price("anthropic", MODELS["anthropic"])
    assert price is not None
    for r in rows(store, requests_t):
        assert r["answered_via"] == "batch" and r["batch_id"] == batch["id"]
        assert r["cost_usd"] == pytest.approx(price.cost(r["input_tokens"], r["output_tokens"], batch=True))
    assert all(a["batch_id"] == batch["id"] for a in rows(store, attempts_t))  # no online attempt
    store.close()


def test_auto_on_a_provider_without_a_batch_api_is_called_online_at_once(db_url: str) -> None:
    with running_mock_provider(batch_latency=100.0) as mock:
        settings = batch_settings(db_url, mock)
        enqueue_auto(settings, 20, "openai-compatible", None)
        store = Store(db_url)
        queued = rows(store, requests_t)
        assert {r["delivery"] for r in queued} == {"online"}  # never waits for a batch
        now = datetime.now(UTC)
        assert all(abs((utc(r["deadline"]) - now).total_seconds() - 86400) < 120 for r in queued)  # 24 h by default
        run(settings)
        assert mock.stats()["batch_creates"] == {}
    assert rows(store, batches_t) == []
    answered_once(store)
    assert {r["answered_via"] for r in rows(store, requests_t)} == {"online"}
    store.close()


def test_answers_a_canceling_batch_gives_after_its_requests_went_online_are_kept_as_attempts_only(
    db_url: str,
) -> None:
    # The provider takes 3 s to cancel (as OpenAI's `cancelling` does): the ledger does not wait.
    with running_mock_provider(batch_latency=50.0, batch_finalize_seconds=3.0) as mock:
        settings = batch_settings(db_url, mock, LEDGER_DEADLINE_MARGIN_SECONDS=20)
        enqueue_auto(settings, 100, "openai", "30s")
        run(settings)
    store = Store(db_url)
    (batch,) = rows(store, batches_t)
    assert batch["status"] == "canceled"
    attempts = answered_once(store)
    requests = rows(store, requests_t)
    assert {r["answered_via"] for r in requests} == {"online"}  # taken out before any batch answer came
    late = [rid for rid, seen in attempts.items() if seen[("succeeded", "answered_late")]]
    assert late  # the batch answered some of them before the cancel: paid for, not their result
    late_costs = [a["cost_usd"] for a in rows(store, attempts_t) if a["error_code"] == "answered_late"]
    assert len(late_costs) == len(late) and all(c is not None and c > 0 for c in late_costs)
    store.close()


def test_a_job_spec_with_delivery_auto_goes_into_a_batch_with_its_deadline_and_report_shows_the_saving(
    db_url: str,
) -> None:
    spec = load_spec(EXAMPLE_SPEC)
    spec = replace(spec, id="auto-eval", delivery="auto", deadline=(datetime.now(UTC) + timedelta(hours=2)).isoformat())
    with running_mock_provider(batch_latency=0.2) as mock:
        settings = batch_settings(db_url, mock)
        store = Store(db_url)
        trigger(store, settings, spec)
        run(settings)
        assert mock.stats()["batch_creates"] == {"openai": 1}
    job = store.get_job("auto-eval")
    assert job is not None and job["status"] == "completed"
    requests = rows(store, requests_t)
    assert len(requests) == 30 and {r["answered_via"] for r in requests} == {"batch"}
    assert {utc(r["deadline"]) for r in requests} == {datetime.fromisoformat(spec.deadline or "")}
    shown = CliRunner().invoke(app, ["report", "auto-eval"], env={"LEDGER_DATABASE_URL": db_url}).stdout
    assert "saved by provider batches" in shown and "30 via batch" in shown and "0 answered late" in shown
    store.close()


def test_a_request_past_its_deadline_is_not_refused_it_is_finished_online_and_counted_late(db_url: str) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    with running_mock_provider(batch_latency=100.0) as mock:
        settings = batch_settings(db_url, mock)
        enqueue_auto(settings, 10, "openai", past, job_id="late")
        run(settings)
        assert mock.stats()["batch_creates"] == {}  # never batched: no time for one
    store = Store(db_url)
    answered_once(store)
    assert {r["answered_via"] for r in rows(store, requests_t)} == {"online"}
    said = store.job_delivery("late")
    assert said["late"] == 10 and said["answered_via"] == {"online": 10}
    store.close()
