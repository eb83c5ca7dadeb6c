"""Anthropic Message Batches through the official SDK: one create call carrying every request.

The request body (`{"requests": [...]}`) is built on disk by the ledger and sent
from the file, never whole in memory. Message batches carry no metadata, so a
batch accepted before a crash kept the ledger from recording it is recognised by
its creation time and request count, and confirmed by the `custom_id`s in its results.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import anthropic
import anyio
from anthropic.types.messages import MessageBatch

from adapters.anthropic import message_result
from adapters.anthropic_format import messages_body
from adapters.base import CallRequest
from adapters.batch_interface import BatchLayout, BatchLine, BatchTag, ProviderBatch, ReconcileLater
from adapters.errors import BatchRejection, sdk_errors
from adapters.json_lines import compact_json, json_and_text_at, nonblank_lines

# The provider's own limits per batch (https://docs.anthropic.com/en/docs/build-with-claude/batch-processing).
MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
_CHUNK = 1 << 16
# Error types of an `errored` result worth another try, with the HTTP status they stand for.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
_RETRYABLE = {"rate_limit_error", "api_error", "overloaded_error", "timeout_error"}


class AnthropicBatches:
    name = "anthropic"
    max_requests = MAX_REQUESTS
    max_bytes = MAX_BYTES
    uploads_input = False
    layout = BatchLayout(head=b'{"requests":[', sep=b",", tail=b"]}")

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        self._client = anthropic.AsyncAnthropic(api_key=api_key or "not-needed", base_url=base_url, max_retries=0)

    def encode(self, custom_id: str, request: CallRequest) -> bytes:
        # messages_body always sets max_tokens, which every Message Batches entry needs.
        return compact_json({"custom_id": custom_id, "params": messages_body(request)})

    async def upload(self, path: Path) -> str | None:
        return None  # the requests travel in the create call's body

    async def create(self, path: Path, input_file_id: str | None, tag: BatchTag) -> ProviderBatch:
        size = path.stat().st_size

        async def body() -> AsyncIterator[bytes]:
            async with await anyio.open_file(path, "rb") as stream:
                while chunk := await stream.read(_CHUNK):
                    yield chunk

        with sdk_errors(anthropic, rejections=_rejections):
            created = await self._client.post(
                "/v1/messages/batches",
                cast_to=MessageBatch,
                content=body(),
                options={"headers": {"content-type": "application/json", "content-length": str(size)}},
            )
        return _batch(created)

    async def find(
        self, tag: BatchTag, created_after: float, total: int, is_ours: Callable[[str], bool]
    ) -> ProviderBatch | None:
        """Candidates: created since `created_after`, with `total` requests. An ended one is ours when
        its first result's custom_id is; a single one still processing is taken as ours (its results
        are checked line by line when mapped: lines not ours are ignored). Several still processing:
        `ReconcileLater`, never a second batch."""
        processing: list[ProviderBatch] = []
        with sdk_errors(anthropic):
            async for listed in self._client.messages.batches.list(limit=100):
                found = _batch(listed)
                if found.created_at is not None and found.created_at < created_after:
                    break  # newest first: the rest is older than the ledger batch
                if found.total != total:
                    continue
                if not found.ended:
                    processing.append(found)
                elif await self._first_custom_id_is_ours(found.id, is_ours):
                    return found
        if len(processing) > 1:
            raise ReconcileLater(f"{len(processing)} batches of {total} requests still processing")
        return processing[0] if processing else None

    async def _first_custom_id_is_ours(self, batch_id: str, is_ours: Callable[[str], bool]) -> bool:
        lines = nonblank_lines(self._client.messages.batches.with_streaming_response.results(batch_id))
        try:
            async for line in lines:
                return is_ours(str(json.loads(line).get("custom_id")))
            return False
        finally:
            await lines.aclose()  # only the first line is read: close the download now

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        with sdk_errors(anthropic):
            return _batch(await self._client.messages.batches.retrieve(batch_id))

    async def cancel(self, batch_id: str) -> ProviderBatch:
        with sdk_errors(anthropic):
            return _batch(await self._client.messages.batches.cancel(batch_id))

    async def results(self, batch: ProviderBatch) -> AsyncIterator[BatchLine]:
        with sdk_errors(anthropic):
            async for line in nonblank_lines(self._client.messages.batches.with_streaming_response.results(batch.id)):
                yield result_line(line)

    async def clean_up(self, batch: ProviderBatch) -> None:
        """Anthropic deletes a batch's results on its own (29 days after creation)."""

    async def aclose(self) -> None:
        await self._client.close()


def result_line(line: str | bytes) -> BatchLine:
    obj, message_text = json_and_text_at(line, ("result", "message"))
    custom_id = str(obj.get("custom_id"))
    result = obj.get("result") or {}
    kind = result.get("type")
    if kind == "succeeded":
        return BatchLine(custom_id, "succeeded", message_result(result.get("message"), 200, message_text), 200)
    if kind in ("expired", "canceled"):
        return BatchLine(custom_id, kind, error_code=f"batch_{kind}")
    error = (result.get("error") or {}).get("error") or {}
    error_type = str(error.get("type") or "api_error")
    return BatchLine(
        custom_id,
        "failed",
        status_code=_ERROR_STATUS.get(error_type),
        error_code=error_type,
        message=str(error.get("message") or "batch request errored"),
        retryable=error_type in _RETRYABLE,
    )


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _batch(batch: MessageBatch) -> ProviderBatch:
    counts = batch.request_counts
    by_kind = {
        "processing": counts.processing,
        "succeeded": counts.succeeded,
        "errored": counts.errored,
        "canceled": counts.canceled,
        "expired": counts.expired,
    }
    state = "in_progress"
    if batch.processing_status == "ended":
        state = "canceled" if batch.cancel_initiated_at else "expired" if counts.expired else "completed"
    return ProviderBatch(
        id=batch.id,
        status=batch.processing_status,
        state=state,
        total=sum(by_kind.values()),
        counts=by_kind,
        created_at=_ts(batch.created_at),
    )


def _rejections(exc: anthropic.APIStatusError) -> tuple[BatchRejection, ...]:
    """A 400 at create names the bad entry as `requests.N...`: that line, not the whole batch."""
    if exc.status_code != 400:
        return ()
    body = exc.body if isinstance(exc.body, dict) else {}
    message = str((body.get("error") or {}).get("message") or exc.message)
    _, _, rest = message.partition("requests.")
    index = rest.split(".", 1)[0].split(":", 1)[0]
    return (BatchRejection(int(index) if index.isdigit() else None, "invalid_request_error", message),)
