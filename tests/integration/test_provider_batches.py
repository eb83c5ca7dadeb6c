"""Provider batch jobs end to end: the real SDKs against the mock provider, on both databases."""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import openai
import pytest
from sqlalchemy import text

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.answers import chat_answer
from ledger.daemon import run_daemon
from ledger.store import Store
from tests.integration.batch_helpers import attempts_t, batch_settings, batches_t, enqueue, requests_t, rows, run
from tests.integration.store_helpers import kept_records

AUDIT_DOC = Path(__file__).parents[2] / "docs" / "audit.md"


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.2) as server:
        yield server


def test_a_thousand_requests_make_one_batch_per_provider_and_every_answer_comes_home(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock)
    enqueue(settings, [f"item {i}" for i in range(1000)], provider="openai", model="gpt-4o-mini")
    enqueue(settings, [f"item {i}" for i in range(1000)], provider="anthropic", model="claude-haiku-4-5")
    run(settings)

    assert mock.stats()["batch_creates"] == {"openai": 1, "anthropic": 1}
    store = Store(db_url)
    batches = rows(store, batches_t)
    assert [(b["provider"], b["status"], b["request_total"]) for b in batches] == [
        ("openai", "completed", 1000),
        ("anthropic", "completed", 1000),
    ]
    price = {
        "openai": settings.prices.price("openai", "gpt-4o-mini"),
        "anthropic": settings.prices.price("anthropic", "claude-haiku-4-5"),
    }
    batch_of = {b["provider"]: b["id"] for b in batches}
    requests = rows(store, requests_t)
    assert len(requests) == 2000
    for r in requests:
        expected = chat_answer(r["model"], None, r["input"]["messages"], None)
        assert r["status"] == "completed"
        assert r["raw_output"] == expected.text  # its own answer, not a sibling's
        assert (r["input_tokens"], r["output_tokens"]) == (expected.input_tokens, expected.output_tokens)
        p = price[r["provider"]]
        assert p is not None and p.batch_discount == 0.5
        assert r["cost_usd"] == pytest.approx(p.cost(r["input_tokens"], r["output_tokens"], batch=True))
        assert r["batch_id"] == batch_of[r["provider"]]
    attempts = rows(store, attempts_t)
    assert Counter((a["request_id"], a["outcome"]) for a in attempts) == Counter(
        (r["id"], "succeeded") for r in requests
    )
    assert {a["batch_id"] for a in attempts} == set(batch_of.values())
    # The batch audit query of docs/audit.md: per-batch cost is the sum of its requests', turnaround known.
    query = re.findall(r"```sql\n(.*?)```", AUDIT_DOC.read_text(), flags=re.S)[2]
    assert "llm_batch_audit" in query
    with store.engine.connect() as conn:
        audited = conn.execute(text(query)).mappings().all()
    for b in audited:
        mine = [r for r in requests if r["batch_id"] == b["id"]]
        assert (b["status"], b["request_total"], b["completed"], b["failed"]) == ("completed", 1000, 1000, 0)
        assert b["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in mine))
        assert b["turnaround_s"] is not None and b["turnaround_s"] > 0
    store.close()


def test_models_params_and_jobs_make_separate_batches(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    enqueue(settings, [f"a {i}" for i in range(5)], model="gpt-4o-mini", params={"temperature": 0})
    enqueue(settings, [f"b {i}" for i in range(5)], model="gpt-4o-mini", params={"temperature": 1})
    enqueue(settings, [f"c {i}" for i in range(5)], model="gpt-4o", params={"temperature": 0})
    enqueue(settings, [f"d {i}" for i in range(5)], model="gpt-4o-mini", params={"temperature": 0}, job_id="j2")
    run(settings)

    store = Store(db_url)
    batches = rows(store, batches_t)
    assert len(batches) == 4 and all(b["request_total"] == 5 for b in batches)
    for b in batches:  # each batch holds one model, one set of params, one job
        members = rows(store, requests_t, requests_t.c.batch_id == b["id"])
        assert len({(r["model"], str(r["params"]), r["job_id"]) for r in members}) == 1
    assert all(r["status"] == "completed" for r in rows(store, requests_t))
    store.close()


def test_a_group_over_the_count_or_byte_limit_is_split(db_url: str, mock: RunningMockProvider) -> None:
    by_count = batch_settings(db_url, mock, LEDGER_PROVIDER_BATCH_SIZE=40)
    enqueue(by_count, [f"count {i}" for i in range(100)])
    run(by_count)
    store = Store(db_url)
    assert sorted(b["request_total"] for b in rows(store, batches_t)) == [20, 40, 40]

    by_bytes = batch_settings(db_url, mock, LEDGER_PROVIDER_BATCH_MAX_BYTES=4096)
    enqueue(by_bytes, [f"bytes {i} " + "x" * 100 for i in range(60)], model="gpt-4o")
    run(by_bytes)
    split = [b for b in rows(store, batches_t) if b["model"] == "gpt-4o"]
    assert len(split) > 1
    assert all(b["input_bytes"] <= 4096 for b in split)
    assert sum(b["request_total"] for b in split) == 60
    assert all(r["status"] == "completed" for r in rows(store, requests_t))
    store.close()


@pytest.mark.parametrize("provider,model", [("openai", "gpt-4o-mini"), ("gemini", "gemini-2.5-flash")])
def test_line_errors_are_retried_in_a_later_batch_and_permanent_ones_fail(
    db_url: str, mock: RunningMockProvider, provider: str, model: str
) -> None:
    # Retries come due over the jitter's half second; waiting a second gathers them in one batch.
    settings = batch_settings(db_url, mock, LEDGER_PROVIDER_BATCH_WAIT=1)
    prompts = [f"p {i}" + (" [[mock:fail=500x1]]" if i % 4 == 0 else "") for i in range(20)]
    prompts.append("never [[mock:fail=400x*]]")
    enqueue(settings, prompts, provider=provider, model=model)
    run(settings)

    store = Store(db_url)
    batches = rows(store, batches_t)
    assert [b["request_total"] for b in batches] == [21, 5]  # the second carries only the retried lines
    requests = {r["input"]["messages"][0]["content"]: r for r in rows(store, requests_t)}
    for prompt, r in requests.items():
        outcomes = [a["outcome"] for a in rows(store, attempts_t, attempts_t.c.request_id == r["id"])]
        if "fail=500" in prompt:
            assert (r["status"], outcomes, r["batch_id"]) == ("completed", ["failed", "succeeded"], batches[1]["id"])
        elif "fail=400" in prompt:
            assert (r["status"], outcomes, r["last_status_code"]) == ("error", ["failed"], 400)
        else:
            assert (r["status"], outcomes, r["batch_id"]) == ("completed", ["succeeded"], batches[0]["id"])
    store.close()


@pytest.mark.parametrize(
    "provider,model", [("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5"), ("gemini", "gemini-2.5-flash")]
)
def test_an_expired_batch_resubmits_only_its_missing_requests(
    db_url: str, mock: RunningMockProvider, provider: str, model: str
) -> None:
    # One attempt allowed: a request the provider never reached must not spend it.
    settings = batch_settings(db_url, mock, RETRY_MAX_ATTEMPTS=1)
    enqueue(
        settings, [f"e {i}" + (" [[mock:expire]]" if i < 3 else "") for i in range(10)], provider=provider, model=model
    )
    run(settings)

    store = Store(db_url)
    first, second = rows(store, batches_t)
    said = {"openai": "expired", "anthropic": "ended", "gemini": "JOB_STATE_EXPIRED"}[provider]
    assert (first["status"], first["provider_status"]) == ("error", said)
    assert (second["status"], second["request_total"]) == ("completed", 3)
    for r in rows(store, requests_t):
        outcomes = [a["outcome"] for a in rows(store, attempts_t, attempts_t.c.request_id == r["id"])]
        assert r["status"] == "completed"
        if "expire" in r["input"]["messages"][0]["content"]:
            assert (outcomes, r["batch_id"]) == (["expired", "succeeded"], second["id"])
        else:  # finished in the expired batch: kept, never sent again
            assert (outcomes, r["batch_id"]) == (["succeeded"], first["id"])
    store.close()


@pytest.mark.parametrize("provider,model", [("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")])
def test_a_batch_failing_validation_fails_the_named_request_and_requeues_the_rest(
    db_url: str, mock: RunningMockProvider, provider: str, model: str
) -> None:
    settings = batch_settings(db_url, mock)
    enqueue(
        settings, [f"v {i}" + (" [[mock:invalid]]" if i == 2 else "") for i in range(5)], provider=provider, model=model
    )
    run(settings)

    store = Store(db_url)
    first, second = rows(store, batches_t)
    assert first["status"] == "error" and "invalid" in first["error"]
    assert (second["status"], second["request_total"]) == ("completed", 4)
    for r in rows(store, requests_t):
        if "invalid" in r["input"]["messages"][0]["content"]:
            assert r["status"] == "error" and "invalid" in r["error_message"]
        else:
            assert r["status"] == "completed"
    store.close()


def test_a_provider_without_a_batch_api_completes_the_requests_online(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    enqueue(settings, [f"o {i}" for i in range(6)], provider="openai-compatible", model="llama3")
    with kept_records("ledger.events", logging.NOTSET) as collect:
        run(settings)

    store = Store(db_url)
    assert all(r["status"] == "completed" and r["delivery"] == "online" for r in rows(store, requests_t))
    assert rows(store, batches_t) == []
    assert mock.stats()["calls"] == 6 and mock.stats()["batch_creates"] == {}
    events = [getattr(r, "event_fields", {}) for r in collect.records]
    said = [e for e in events if e.get("event") == "simulated_batching"]
    assert len(said) == 1 and said[0]["provider"] == "openai-compatible"  # said once, for all six
    store.close()


def test_cost_from_the_price_table_online_and_for_unknown_models_none(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    enqueue(settings, ["priced"], model="gpt-4o", delivery="online")
    enqueue(settings, ["unpriced"], model="some-local-model", delivery="online")
    run(settings)

    store = Store(db_url)
    priced, unpriced = rows(store, requests_t)
    price = settings.prices.price("openai", "gpt-4o")
    assert price is not None
    assert priced["cost_usd"] == pytest.approx((priced["input_tokens"] * 2.50 + priced["output_tokens"] * 10.00) / 1e6)
    assert price.cost(1_000_000, 0, batch=True) == pytest.approx(1.25)  # half price in a batch
    assert unpriced["status"] == "completed" and unpriced["cost_usd"] is None
    assert store.unpriced_count() == 1
    store.close()


def test_a_cancel_the_provider_refuses_once_the_batch_ended_does_not_keep_its_results_from_coming_home(
    db_url: str,
) -> None:
    """A cancel marked while the batch was running reaches the provider only after the batch has
    ended (the daemon was stopped in between), and the provider refuses it. The poll looks at the
    batch all the same: it ended, so its results are mapped back. Before, each poll stopped at the
    refused cancel, noted the refusal and never looked: the requests stayed `submitted` for good."""
    with running_mock_provider(batch_latency=0.3, batch_cancel_ended_refused=True) as mock:
        enqueue(batch_settings(db_url, mock), [f"question {i}" for i in range(5)])
        store = Store(db_url)

        async def submit_then_stop() -> None:
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: run_daemon(
                        batch_settings(db_url, mock, LEDGER_BATCH_POLL_INTERVAL=60), stop=stop, handle_signals=False
                    )
                )
                with anyio.fail_after(30):
                    while not [b for b in rows(store, batches_t) if b["status"] == "submitted"]:
                        await anyio.sleep(0.02)
                stop.set()

        anyio.run(submit_then_stop)
        (batch,) = rows(store, batches_t)
        assert [b["id"] for b in store.request_batch_cancel(batch_id=batch["id"])] == [batch["id"]]
        client = openai.OpenAI(base_url=mock.openai_base_url, api_key="test-key")
        deadline = time.monotonic() + 30  # the provider polled until the batch has ended
        while client.batches.retrieve(str(batch["provider_batch_id"])).status != "completed":
            assert time.monotonic() < deadline, "the provider's batch did not end"
            time.sleep(0.05)
        with pytest.raises(openai.BadRequestError):  # the provider refuses a cancel now
            client.batches.cancel(str(batch["provider_batch_id"]))
        run(batch_settings(db_url, mock), timeout=30)
    (batch,) = rows(store, batches_t)
    assert (batch["status"], batch["provider_status"], batch["poll_error"]) == ("completed", "completed", None)
    assert batch["cancel_sent_at"] is None  # never taken
    assert store.status_counts()["completed"] == 5
    store.close()
