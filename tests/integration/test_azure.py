"""Azure OpenAI online (both databases): the real `openai.AsyncAzureOpenAI` against the mock's Azure
paths, a deployment name as the model, the answer priced by the model it names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from adapters.mock_provider.wire import AZURE_DEFAULT_MODEL
from ledger.api import Ledger
from ledger.prices import load_prices
from ledger.settings import Settings
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, example_with_judge, requests_t, rows, run


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider() as server:
        yield server


def azure_settings(db_url: str, mock: RunningMockProvider, **more: Any) -> Settings:
    return batch_settings(db_url, mock, AZURE_OPENAI_ENDPOINT=mock.base_url, AZURE_OPENAI_API_KEY="azure-key", **more)


def stored(settings: Settings) -> list[dict[str, Any]]:
    store = Store(settings.database_url)
    try:
        return rows(store, requests_t)
    finally:
        store.close()


@pytest.mark.parametrize("api", [None, "responses"])
def test_a_request_to_an_azure_deployment_is_answered_and_priced_by_the_model_behind_it(
    db_url: str, mock: RunningMockProvider, api: str | None
) -> None:
    settings = azure_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue(
            provider="azure",
            model="judges-prod",  # a deployment name of the user's own
            messages=[{"role": "user", "content": "Grade this. End with VERDICT: <1-5>."}],
            params={"max_tokens": 200},
            api=api,
        )
        run(settings)
    (row,) = stored(settings)
    assert row["status"] == "completed" and row["endpoint"] == "azure:judges-prod"
    assert row["raw_output"] and row["input_tokens"] and row["output_tokens"]
    assert mock.server.stats()["calls"] == 1
    if api is None:  # chat: the answer names the model behind the deployment, which prices it
        assert row["response"]["model"] == AZURE_DEFAULT_MODEL
        price = load_prices().price("openai", AZURE_DEFAULT_MODEL)
        assert price is not None
        assert row["cost_usd"] == pytest.approx(price.cost(row["input_tokens"], row["output_tokens"]))
    else:
        assert row["api"] == "responses"


def test_without_an_azure_endpoint_the_daemon_says_which_variable_is_missing(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock, RETRY_MAX_ATTEMPTS=1)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue(provider="azure", model="d", messages=[{"role": "user", "content": "hi"}])
        run(settings)
    (row,) = stored(settings)
    assert row["status"] == "error" and "AZURE_OPENAI_ENDPOINT must be set" in (row["error_message"] or "")


@pytest.mark.parametrize("batching", [False, True], ids=["per-dimension", "structured"])
def test_the_example_evaluation_runs_with_an_azure_judge(
    db_url: str, mock: RunningMockProvider, batching: bool
) -> None:
    settings = azure_settings(db_url, mock, BATCHING_ENABLED=batching)
    store, _ = example_with_judge(settings, "azure", "eval-judge", "azure-eval")
    azure_rows = [r for r in store.list_requests(job_id="azure-eval", limit=100) if r["provider"] == "azure"]
    assert len(azure_rows) == (1 if batching else 10)  # structured: every dimension in one request
    store.close()


def test_an_azure_batch_maps_every_answer_and_deletes_every_file_it_made(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = azure_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(
            {
                "provider": "azure",
                "model": "global-batch",  # one batch deployment for every line
                "messages": [{"role": "user", "content": f"Grade essay {i}. End with VERDICT: <1-5>."}],
                "delivery": "batch",
                "idempotency_key": f"azure-batch:{i}",
            }
            for i in range(5)
        )
        run(settings)
    found = stored(settings)
    stats = mock.server.stats()
    assert stats["calls"] == 0 and stats["batch_lines"] == 5  # no online call: one provider batch
    price = load_prices().price("openai", AZURE_DEFAULT_MODEL)
    assert price is not None and price.batch_discount > 0
    for row in found:
        assert row["status"] == "completed" and row["batch_id"] is not None
        assert row["response"]["model"] == AZURE_DEFAULT_MODEL
        assert row["cost_usd"] == pytest.approx(price.cost(row["input_tokens"], row["output_tokens"], batch=True))
    # The input, the output and the (empty) error file: all deleted once the results were mapped.
    assert stats["files"] == [] and len(stats["deleted_files"]) == 3
