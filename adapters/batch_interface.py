"""What the provider-batch stage needs from a provider with a batch API (`BatchAdapter`), and a
batch job, its input's layout and its result lines in the ledger's words.

Kept apart from the one-call interface (`base`), which the online path needs alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from adapters.base import CallRequest, CallResult
from adapters.errors import BatchRejection


@dataclass(frozen=True)
class BatchLayout:
    """How a provider's batch input is laid out on disk: `head`, one encoded entry per
    request joined by `sep`, `tail`. Lets the ledger build the input streaming and know
    its exact size before it is written."""

    head: bytes
    sep: bytes
    tail: bytes

    def size(self, entries: int, entry_bytes: int) -> int:
        return len(self.head) + entry_bytes + len(self.sep) * max(entries - 1, 0) + len(self.tail)


@dataclass(frozen=True)
class BatchTag:
    """What names a ledger batch at the provider: carried in metadata where the provider has it."""

    ledger_batch_id: int
    submit_key: str


@dataclass(frozen=True)
class ProviderBatch:
    """A provider batch job as last read, in the ledger's words.

    `state` is one of in_progress, completed, expired, canceled, failed: `ended` once
    no further change will come and results (if any) can be read. `status` keeps the
    provider's own word (`cancelling` is not `cancelled`).
    """

    id: str
    status: str
    state: str
    total: int | None
    counts: dict[str, int]
    created_at: float | None = None
    tag: BatchTag | None = None
    rejections: tuple[BatchRejection, ...] = ()
    output_file_id: str | None = None
    error_file_id: str | None = None
    input_file_id: str | None = None

    @property
    def ended(self) -> bool:
        return self.state != "in_progress"


@dataclass(slots=True)  # not frozen: built per mapped line, and a frozen __init__ costs three times as much
class BatchLine:
    """One request's result in a batch's output, found by its `custom_id`.

    `kind`: succeeded, failed (the request's own error: follows the retry policy),
    expired or canceled (the batch ended before reaching it: no answer, not counted).
    """

    custom_id: str
    kind: str
    answer: CallResult | None = None  # succeeded: the answer, whole
    status_code: int | None = None
    error_code: str | None = None
    message: str | None = None
    retryable: bool = False


class ReconcileLater(Exception):
    """Candidates for a batch created before a crash exist but cannot be told apart yet."""


class BatchAdapter(Protocol):
    """What the provider-batch stage needs from a provider with a batch API.

    Submission is split so the ledger can record each step before the next:
    `upload` (a file id to store before `create`), then `create`. `find` looks
    for a batch the provider accepted before a crash kept the ledger from
    recording it; `results` streams an ended batch's lines, never whole in memory.
    """

    name: str
    max_requests: int
    max_bytes: int
    layout: BatchLayout
    uploads_input: bool  # the input is uploaded as a file (its id stored) before the create call

    def encode(self, custom_id: str, request: CallRequest) -> bytes:
        """One entry of the input (without separators)."""
        ...

    async def upload(self, path: Path) -> str | None: ...

    async def create(self, path: Path, input_file_id: str | None, tag: BatchTag) -> ProviderBatch: ...

    async def find(
        self, tag: BatchTag, created_after: float, total: int, is_ours: Callable[[str], bool]
    ) -> ProviderBatch | None: ...

    async def retrieve(self, batch_id: str) -> ProviderBatch: ...

    def results(self, batch: ProviderBatch) -> AsyncIterator[BatchLine]: ...

    async def cancel(self, batch_id: str) -> ProviderBatch: ...

    async def clean_up(self, batch: ProviderBatch) -> None:
        """After an ended batch's results are mapped: what the provider keeps for it that the
        ledger no longer needs (Azure: its files, a resource holds at most 500)."""

    async def aclose(self) -> None: ...
