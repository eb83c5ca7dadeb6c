"""OpenAI Batch API through the official SDK: a JSONL file uploaded, then a batch created.

The ledger batch travels in the batch's `metadata`, so a batch accepted before a
crash kept the ledger from recording it is found again by listing batches.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import openai

from adapters.base import CallRequest
from adapters.batch_interface import BatchLayout, BatchLine, BatchTag, ProviderBatch
from adapters.errors import RETRYABLE_STATUS, BatchRejection, ProviderError, sdk_errors
from adapters.json_lines import compact_json, json_and_text_at, nonblank_lines
from adapters.openai import completion_result
from adapters.openai_chat import chat_body
from adapters.openai_responses import ENDPOINT as RESPONSES_ENDPOINT
from adapters.openai_responses import RESPONSES_API, responses_body, responses_result

ENDPOINT: Final = "/v1/chat/completions"
# The provider's own limits per batch (https://platform.openai.com/docs/guides/batch).
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
_STATES = {"completed": "completed", "expired": "expired", "cancelled": "canceled", "failed": "failed"}
# Error-file codes that mean "not reached", not "this request failed".
_NOT_REACHED = {"batch_expired": "expired", "batch_cancelled": "canceled", "batch_canceled": "canceled"}


class OpenAIBatches:
    name = "openai"
    max_requests = MAX_REQUESTS
    max_bytes = MAX_BYTES
    uploads_input = True
    layout = BatchLayout(head=b"", sep=b"\n", tail=b"\n")
    # Each line's `url`, per API (Azure's have no /v1).
    chat_url: str = ENDPOINT
    responses_url: str = RESPONSES_ENDPOINT

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        self._client = openai.AsyncOpenAI(api_key=api_key or "not-needed", base_url=base_url, max_retries=0)

    def encode(self, custom_id: str, request: CallRequest) -> bytes:
        if request.api == RESPONSES_API:
            url, body = self.responses_url, responses_body(request, self.name)
        else:
            url, body = self.chat_url, chat_body(request, self.name)
        return compact_json({"custom_id": custom_id, "method": "POST", "url": url, "body": body})

    async def upload(self, path: Path) -> str | None:
        # The SDK hands the open file to the HTTP client, which streams it.
        with path.open("rb") as stream, sdk_errors(openai):
            uploaded = await self._client.files.create(file=(path.name, stream), purpose="batch")
        return str(uploaded.id)

    async def create(self, path: Path, input_file_id: str | None, tag: BatchTag) -> ProviderBatch:
        if input_file_id is None:
            raise ValueError("OpenAI batches need an uploaded input file")
        with sdk_errors(openai):
            created = await self._client.batches.create(
                input_file_id=input_file_id,
                endpoint=endpoint_of(path),
                completion_window="24h",
                metadata={"ledger_batch_id": str(tag.ledger_batch_id), "ledger_submit_key": tag.submit_key},
            )
        return batch_view(created)

    async def find(
        self, tag: BatchTag, created_after: float, total: int, is_ours: Callable[[str], bool]
    ) -> ProviderBatch | None:
        """The batch whose metadata names this ledger batch, among those created since `created_after`."""
        with sdk_errors(openai):
            async for listed in self._client.batches.list(limit=100):
                found = batch_view(listed)
                if found.tag == tag:
                    return found
                if found.created_at is not None and found.created_at < created_after:
                    return None  # newest first: everything further is older than the ledger batch
        return None

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        with sdk_errors(openai):
            return batch_view(await self._client.batches.retrieve(batch_id))

    async def cancel(self, batch_id: str) -> ProviderBatch:
        with sdk_errors(openai):
            return batch_view(await self._client.batches.cancel(batch_id))

    async def results(self, batch: ProviderBatch) -> AsyncIterator[BatchLine]:
        """The output file's lines, then the error file's, streamed."""
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id is None:
                continue
            with sdk_errors(openai):
                async for line in nonblank_lines(self._client.files.with_streaming_response.content(file_id)):
                    yield result_line(line)

    async def clean_up(self, batch: ProviderBatch) -> None:
        """OpenAI keeps a batch's files within the organisation's storage: left to the user."""

    async def aclose(self) -> None:
        await self._client.close()


def endpoint_of(path: Path) -> Any:
    """The endpoint of a batch's input: its first line's `url` (a batch holds requests of one API
    only, as the ledger groups them by it), chat completions for an empty file."""
    with path.open("rb") as stream:
        first = stream.readline()
    url = json.loads(first).get("url") if first.strip() else None
    return RESPONSES_ENDPOINT if url == RESPONSES_ENDPOINT else ENDPOINT


def result_line(line: str | bytes) -> BatchLine:
    """One line of an output or error file."""
    obj, body_text = json_and_text_at(line, ("response", "body"))
    custom_id = str(obj.get("custom_id"))
    response = obj.get("response") or {}
    error = obj.get("error") or {}
    status = response.get("status_code")
    if status == 200:
        body = response.get("body")
        read = responses_result if isinstance(body, dict) and body.get("object") == "response" else completion_result
        try:
            result = read(body, 200, body_text)
        except ProviderError as exc:
            return BatchLine(
                custom_id,
                "failed",
                status_code=exc.status_code,
                error_code=exc.code,
                message=exc.message,
                retryable=exc.retryable,
            )
        return BatchLine(custom_id, "succeeded", result, 200)
    code = str(error.get("code") or "")
    if code in _NOT_REACHED:
        return BatchLine(custom_id, _NOT_REACHED[code], error_code=code, message=error.get("message"))
    body_error = (response.get("body") or {}).get("error") or {}
    message = body_error.get("message") or error.get("message") or "batch request failed"
    return BatchLine(
        custom_id,
        "failed",
        status_code=status,
        error_code=str(body_error.get("code") or body_error.get("type") or code or f"http_{status}"),
        message=str(message),
        retryable=status in RETRYABLE_STATUS,
    )


def batch_view(batch: Any) -> ProviderBatch:
    counts = batch.request_counts
    metadata = batch.metadata or {}
    tag = None
    if "ledger_batch_id" in metadata and "ledger_submit_key" in metadata:
        tag = BatchTag(int(metadata["ledger_batch_id"]), str(metadata["ledger_submit_key"]))
    rejections = tuple(
        BatchRejection(e.line - 1 if e.line else None, str(e.code or "invalid_request"), str(e.message or ""))
        for e in ((batch.errors.data or []) if batch.errors else [])
    )
    return ProviderBatch(
        id=batch.id,
        status=batch.status,
        state=_STATES.get(batch.status, "in_progress"),
        total=counts.total if counts else None,
        counts={"completed": counts.completed, "failed": counts.failed, "total": counts.total} if counts else {},
        created_at=float(batch.created_at),
        tag=tag,
        rejections=rejections,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        input_file_id=batch.input_file_id,
    )
