"""A batch the provider refuses at upload or create is said in one ERROR line naming the batch,
the provider and the provider's words; batch inputs go up as `.jsonl` files (what OpenAI's
Batch API takes, and the mock provider, like it, refuses any other name)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, batches_t, enqueue, rows, run
from tests.integration.store_helpers import kept_records


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def test_a_refused_batch_create_is_one_error_line_naming_batch_provider_and_message(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock)
    prompts = ["fine", "refused [[mock:invalid]]"]
    enqueue(settings, prompts, provider="anthropic", model="claude-haiku-4-5")
    with kept_records("ledger", logging.ERROR) as kept:
        run(settings)
    store = Store(db_url)
    refused = [b for b in rows(store, batches_t) if b["status"] == "error"]
    store.close()
    assert len(refused) == 1
    (line,) = [r for r in kept.records if r.getMessage() == "batch refused by the provider"]
    assert line.levelno == logging.ERROR
    assert line.details == {  # type: ignore[attr-defined]
        "batch_id": refused[0]["id"],
        "provider": "anthropic",
        "error": line.details["error"],  # type: ignore[attr-defined]
    }
    assert "requests.1.params: invalid request (injected)" in line.details["error"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("provider", ["openai", "azure"])
def test_batch_inputs_are_uploaded_as_jsonl_files(db_url: str, mock: RunningMockProvider, provider: str) -> None:
    settings = batch_settings(db_url, mock, AZURE_OPENAI_ENDPOINT=mock.base_url, AZURE_OPENAI_API_KEY="k")
    enqueue(settings, ["one", "two"], provider=provider, model="gpt-4o-mini")
    run(settings)
    store = Store(db_url)
    (batch,) = rows(store, batches_t)
    store.close()
    assert batch["status"] == "completed"
    uploads = mock.stats()["uploaded_names"]
    assert uploads and all(re.fullmatch(r"batch-\d+\.jsonl", name) for name in uploads)
    assert mock.stats()["refused_uploads"] == 0
