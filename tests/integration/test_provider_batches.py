"""Provider batch jobs end to end: the real SDKs against the mock provider, on both databases."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.answers import chat_answer
from ledger.store import Store
from tests.integration.batch_helpers import attempts_t, batch_settings, batches_t, enqueue, requests_t, rows, run


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
    store.close()
