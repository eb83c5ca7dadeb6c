"""The Python API a pipeline stage imports: write requests, never call a model."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import anyio

from ledger import events
from ledger.enqueue import RequestSpec, build_spec, to_row
from ledger.settings import Settings, load_settings
from ledger.store import EnqueueResult, Store


class Ledger:
    """A handle on one ledger database.

    >>> ledger = Ledger("sqlite:///ledger.db")
    >>> request_id = ledger.enqueue(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    """

    def __init__(self, url: str | None = None, *, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.store = Store(url or self.settings.database_url)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(self, spec: RequestSpec | None = None, /, **fields: Any) -> int:
        """Queue one request; returns its id (the existing one if the key was seen before)."""
        spec = spec or build_spec(**fields)
        row = to_row(spec, self.settings.compatible_base_url, self.settings.prices)
        self.enqueue_many([spec])
        return self.store.id_for_key(row["idempotency_key"])

    def enqueue_many(self, specs: Iterable[RequestSpec]) -> EnqueueResult:
        """Queue many requests in one all-or-nothing transaction, idempotently."""
        base_url = self.settings.compatible_base_url
        result = self.store.enqueue(to_row(spec, base_url, self.settings.prices) for spec in specs)
        announce(result)
        return result

    async def aenqueue(self, spec: RequestSpec | None = None, /, **fields: Any) -> int:
        return await anyio.to_thread.run_sync(lambda: self.enqueue(spec, **fields))

    async def aenqueue_many(self, specs: Iterable[RequestSpec]) -> EnqueueResult:
        specs = list(specs)
        return await anyio.to_thread.run_sync(lambda: self.enqueue_many(specs))


def announce(result: EnqueueResult) -> None:
    """`queueing` events for newly queued requests (or one summary line for a huge enqueue)."""
    rows = result.inserted_rows
    if result.inserted and not rows:
        logging.getLogger("ledger.enqueue").info(
            "enqueued",
            extra={
                "details": {
                    "inserted": result.inserted,
                    "duplicates": result.duplicates,
                    "queue_depth": result.queue_depth,
                }
            },
        )
        return
    first_depth = result.queue_depth - len(rows)
    for i, row in enumerate(rows, start=1):
        trace = row.get("trace") or {}
        events.queueing(
            row["id"],
            str(trace.get("agent", "")),
            str(trace.get("dimension", row["idempotency_key"])),
            first_depth + i,
        )
