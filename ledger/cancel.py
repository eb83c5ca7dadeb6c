"""Cancelling what is not final yet: requests, a job, provider batches. One sequence for
`ledger cancel` and the web view's actions, so that both end a job the same way: the job first
(none of its steps starts again), then its requests, then its provider batches (the daemon's
batch loop, `batches.py`, maps back what a batch finished before its cancel)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio

from adapters.batch_interface import BatchAdapter
from adapters.errors import ProviderError
from adapters.registry import make_batch_adapter
from ledger.settings import Settings
from ledger.store import Store
from ledger.store.errors import DatabaseUnavailable, database_unavailable
from ledger.store.schema import one_line


def cancel(
    store: Store,
    settings: Settings,
    *,
    ids: list[int] | None = None,
    job_id: str | None = None,
    batch_id: int | None = None,
) -> Iterator[str]:
    """Cancel the requests `ids` (of `job_id` when both are given), the job `job_id` with its
    requests and batches, the provider batch `batch_id`. Yields one line for each thing done, as
    it is done: a caller that prints them as they come has said what was done before a failure."""
    if job_id and store.cancel_job(job_id):
        yield f"job {job_id} canceled; other jobs go on"
    if ids or job_id:
        result = store.cancel(ids=ids or None, job_id=job_id)
        line = f"canceled {result.canceled} request(s)"
        if result.in_flight:
            line += f"; {result.in_flight} with a call in flight end canceled when the call returns"
        yield line
    if batch_id is not None or job_id:
        said = cancel_batches(store, settings, batch_id=batch_id, job_id=job_id)
        yield from said
        if batch_id is not None and not said:
            yield f"batch {batch_id} is already over; nothing to cancel"


def cancel_batches(
    store: Store, settings: Settings, *, batch_id: int | None = None, job_id: str | None = None
) -> list[str]:
    """Mark open batches canceled and send the cancel to the provider now (a daemon resends it at
    its next poll if this fails). What the provider finished before the cancel is still mapped
    back by the daemon; the rest of the batch's requests end `canceled`. One line per batch."""
    marked = store.request_batch_cancel(batch_id=batch_id, job_id=job_id)
    said = []
    for batch in marked:
        if batch["provider_batch_id"] is None:
            said.append(f"batch {batch['id']}: canceled before it reached the provider")
            continue
        if batch["cancel_sent_at"] is not None:
            said.append(f"batch {batch['id']}: cancel already sent to {batch['provider']}")
            continue
        adapter = make_batch_adapter(batch["provider"], settings)

        async def send(adapter: BatchAdapter = adapter, provider_id: str = batch["provider_batch_id"]) -> str:
            try:
                return (await adapter.cancel(provider_id)).status
            finally:
                await adapter.aclose()

        try:
            status = anyio.run(send)
        except ProviderError as exc:
            said.append(f"batch {batch['id']}: cancel marked; the provider refused it for now ({exc.message})")
            continue
        try:
            with database_unavailable():
                store.note_cancel_sent(int(batch["id"]))
        except DatabaseUnavailable as exc:  # the cancel stays marked (committed above): a daemon sends it again
            said.append(
                f"batch {batch['id']}: {batch['provider']} says {status}; the ledger could not note it"
                f" ({one_line(exc)}), so a daemon sends the cancel again at its next poll (unless the note landed)"
            )
            continue
        said.append(f"batch {batch['id']}: {batch['provider']} says {status}; finished results are mapped back")
    return said
