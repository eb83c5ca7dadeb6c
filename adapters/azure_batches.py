"""Azure OpenAI Batch through the official SDK's `AsyncAzureOpenAI`: OpenAI's batch API on a
resource of the user's, with three differences the ledger cares about.

- Lines say `url: /chat/completions` (no `/v1`), and every line of a batch goes to one global
  batch deployment (the ledger groups batches by model, which for Azure is the deployment).
- An error file is written even when it is empty; Azure does not expire a batch it has not
  finished in 24 h (it keeps going: `ledger batches` shows its age).
- A resource holds at most 500 files: once a batch's results are mapped, its input, output and
  error files are deleted (`clean_up`).

Answers are priced by the model they name (`priced_by_answer`), as online.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import openai

from adapters.azure import azure_client, priced_by_answer
from adapters.batch_interface import BatchLine, BatchTag, ProviderBatch
from adapters.errors import ProviderError, sdk_errors
from adapters.openai_batches import OpenAIBatches, batch_view

LOG = logging.getLogger("adapters.azure_batches")
CHAT: Final = "/chat/completions"
RESPONSES: Final = "/responses"


class AzureBatches(OpenAIBatches):
    name = "azure"
    chat_url = CHAT
    responses_url = RESPONSES

    def __init__(self, *, endpoint: str, api_key: str | None, api_version: str | None) -> None:
        self._client = azure_client(endpoint, api_key, api_version)

    async def create(self, path: Path, input_file_id: str | None, tag: BatchTag) -> ProviderBatch:
        if input_file_id is None:
            raise ValueError("Azure batches need an uploaded input file")
        with path.open("rb") as stream:
            first = stream.readline()
        endpoint = RESPONSES if b'"url":"/responses"' in first else CHAT
        with sdk_errors(openai):
            created = await self._client.batches.create(
                input_file_id=input_file_id,
                endpoint=endpoint,  # type: ignore[arg-type]  # Azure's paths have no /v1
                completion_window="24h",
                metadata={"ledger_batch_id": str(tag.ledger_batch_id), "ledger_submit_key": tag.submit_key},
            )
        return batch_view(created)

    async def results(self, batch: ProviderBatch) -> AsyncIterator[BatchLine]:
        async for line in super().results(batch):
            if line.answer is not None:
                line.answer = priced_by_answer(line.answer)
            yield line

    async def clean_up(self, batch: ProviderBatch) -> None:
        """Delete the batch's input, output and error files (empty or not): a resource holds at
        most 500. A file that cannot be deleted now is logged and left (the batch is mapped)."""
        for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
            if file_id is None:
                continue
            try:
                with sdk_errors(openai):
                    await self._client.files.delete(file_id)
            except ProviderError as exc:
                LOG.warning("could not delete file %s of batch %s: %s", file_id, batch.id, exc.message)
