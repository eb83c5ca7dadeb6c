"""Gemini Batch Mode through the official `google-genai` SDK: the input JSONL uploaded through the
Files API, a batch created from it, polled, its responses file downloaded and read line by line.

Creating a batch is not idempotent at Google and a batch has no metadata, so the ledger names each
one by its own batch in `displayName` (written to the ledger before the create call): after a crash
it lists the provider's batches and adopts the one so named before it would send another.

A batch serves one model (the create call names it); each input line's request names it too, and
the first line's tells `create` which. Lines are `{"key": custom_id, "request": {...}}`; results
`{"key", "response"}` or `{"key", "error"}`, in no promised order. A batch not done within 48 hours
ends `JOB_STATE_EXPIRED`; the lines it did not answer go back to the queue (`ledger.batches`).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from google.genai import types as genai_types

from adapters.base import CallRequest
from adapters.batch_interface import BatchLayout, BatchLine, BatchTag, ProviderBatch
from adapters.errors import RETRYABLE_STATUS
from adapters.gemini import gemini_client, gemini_errors, gemini_failure
from adapters.gemini_format import content_result, wire_request
from adapters.json_lines import compact_json, json_and_text_at

# The provider's limits per batch input file (https://ai.google.dev/gemini-api/docs/batch-mode).
MAX_BYTES = 2 * 1024 * 1024 * 1024
MAX_REQUESTS = 50_000  # the ledger's own cap: Gemini names none but the file's size
_STATES = {
    "JOB_STATE_SUCCEEDED": "completed",
    "JOB_STATE_FAILED": "failed",
    "JOB_STATE_CANCELLED": "canceled",
    "JOB_STATE_EXPIRED": "expired",
}
_NAME = re.compile(r"^ledger-batch-(\d+)-([0-9A-Za-z_-]+)$")


def display_name(tag: BatchTag) -> str:
    """The name a ledger batch goes by at Google: its id and submit key."""
    return f"ledger-batch-{tag.ledger_batch_id}-{tag.submit_key}"


def tag_of(name: str | None) -> BatchTag | None:
    found = _NAME.match(name or "")
    return BatchTag(int(found.group(1)), found.group(2)) if found else None


class GeminiBatches:
    name = "gemini"
    max_requests = MAX_REQUESTS
    max_bytes = MAX_BYTES
    uploads_input = True
    layout = BatchLayout(head=b"", sep=b"\n", tail=b"\n")

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        self._client = gemini_client(api_key, base_url)

    def encode(self, custom_id: str, request: CallRequest) -> bytes:
        body = {"model": f"models/{request.model}", **wire_request(request)}
        return compact_json({"key": custom_id, "request": body})

    async def upload(self, path: Path) -> str | None:
        with gemini_errors():
            uploaded = await self._client.aio.files.upload(
                file=str(path), config={"mime_type": "application/jsonl", "display_name": path.name}
            )
        return str(uploaded.name)

    async def create(self, path: Path, input_file_id: str | None, tag: BatchTag) -> ProviderBatch:
        if input_file_id is None:
            raise ValueError("Gemini batches need an uploaded input file")
        with gemini_errors():
            created = await self._client.aio.batches.create(
                model=model_of(path), src=input_file_id, config={"display_name": display_name(tag)}
            )
        return batch_view(created)

    async def find(
        self, tag: BatchTag, created_after: float, total: int, is_ours: Callable[[str], bool]
    ) -> ProviderBatch | None:
        """The batch named after this ledger batch. Every listed page is read: Google promises no
        order, and a second create is what this must never cause."""
        wanted = display_name(tag)
        with gemini_errors():
            async for listed in await self._client.aio.batches.list(config={"page_size": 100}):
                if listed.display_name == wanted:
                    return batch_view(listed)
        return None

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        with gemini_errors():
            return batch_view(await self._client.aio.batches.get(name=batch_id))

    async def cancel(self, batch_id: str) -> ProviderBatch:
        with gemini_errors():
            await self._client.aio.batches.cancel(name=batch_id)
        return await self.retrieve(batch_id)

    async def results(self, batch: ProviderBatch) -> AsyncIterator[BatchLine]:
        """The responses file's lines: downloaded to a temporary file by the SDK (in chunks, never
        whole in memory), then read a line at a time."""
        if batch.output_file_id is None:
            return
        with tempfile.TemporaryDirectory(prefix="ledger-gemini-") as folder:
            path = Path(folder) / "responses.jsonl"
            with gemini_errors():
                await self._client.aio.files.download(file=batch.output_file_id, destination=str(path))
            with path.open("rb") as stream:
                for line in stream:
                    if line.strip():
                        yield result_line(line)

    async def clean_up(self, batch: ProviderBatch) -> None:
        """Google deletes a batch's files 48 hours after their creation (the input and the
        responses alike), and a project holds up to 20 GB of them: nothing to do here."""

    async def aclose(self) -> None:
        await self._client.aio.aclose()


def model_of(path: Path) -> str:
    """The model of a batch: its first line's (a batch holds requests of one pool, one model)."""
    with path.open("rb") as stream:
        first = stream.readline()
    model = json.loads(first)["request"].get("model") if first.strip() else None
    if not isinstance(model, str) or not model:
        raise ValueError(f"{path.name}: the first line names no model")
    return model


def result_line(line: str | bytes) -> BatchLine:
    """One line of a responses file."""
    obj, body_text = json_and_text_at(line, ("response",))
    custom_id = str(obj.get("key"))
    response = obj.get("response")
    if isinstance(response, dict):
        return BatchLine(custom_id, "succeeded", content_result(response, 200, body_text), 200)
    error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
    code = error.get("code")
    status = code if isinstance(code, int) else 500
    failure = gemini_failure(status, error.get("status"), str(error.get("message") or "batch request failed"), obj)
    return BatchLine(
        custom_id,
        "failed",
        status_code=status,
        error_code=failure.code,
        message=failure.message,
        retryable=status in RETRYABLE_STATUS,
    )


def batch_view(job: genai_types.BatchJob) -> ProviderBatch:
    state = job.state.value if job.state is not None else "JOB_STATE_UNSPECIFIED"
    created = _seconds(job.create_time)
    stats = job.completion_stats
    counts: dict[str, int] = {}
    if stats is not None:
        for key, value in (("completed", stats.successful_count), ("failed", stats.failed_count)):
            if value is not None:
                counts[key] = int(value)
    return ProviderBatch(
        id=str(job.name),
        status=state,
        state=_STATES.get(state, "in_progress"),
        total=None,
        counts=counts,
        created_at=created,
        tag=tag_of(job.display_name),
        output_file_id=job.dest.file_name if job.dest is not None else None,
    )


def _seconds(moment: Any) -> float | None:
    if isinstance(moment, datetime):
        return moment.timestamp()
    return None
