"""Queued requests for the store-level tests: mock-provider rows, one pool per model. And the
ledger's log records, kept for a test to read."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ledger.enqueue import build_spec, to_row
from ledger.store import Store


@contextmanager
def daemon_store(url: str, queued: int = 0) -> Iterator[Store]:
    """A store opened as the daemon opens it, with `queued` requests (`add_requests`), closed after."""
    store = Store(url, ping_on_checkout=False, background_checkpoints=True, prepared_hot_statements=True)
    try:
        add_requests(store, queued)
        yield store
    finally:
        store.close()


def add_requests(
    store: Store,
    n: int,
    *,
    model: str = "m",
    job: str | None = None,
    prefix: str | None = None,
    max_tokens: int | None = None,
    provider: str = "mock",
    delivery: str = "online",
) -> None:
    """`n` requests to pool `<provider>:<model>`, keyed `<prefix>-<i>` (the prefix defaults to the model)."""
    prefix = prefix or model
    params: dict[str, Any] = {"max_tokens": max_tokens} if max_tokens else {}
    store.enqueue(
        to_row(
            build_spec(
                model=model,
                provider=provider,
                delivery=delivery,
                job_id=job,
                idempotency_key=f"{prefix}-{i}",
                messages=[{"role": "user", "content": f"{prefix} {i}"}],
                params=params,
            )
        )
        for i in range(n)
    )


class LogRecords(logging.Handler):
    """The ledger's log records, kept (the ledger's logger may not propagate to pytest's)."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def kept_records(logger: str, level: int) -> Iterator[LogRecords]:
    """The records `logger` logs at `level` or above while in the block."""
    records = LogRecords(level)
    logging.getLogger(logger).addHandler(records)
    try:
        yield records
    finally:
        logging.getLogger(logger).removeHandler(records)


@contextmanager
def event_lines() -> Iterator[LogRecords]:
    """Every event line the ledger logs in the block (whatever logging set-up ran before)."""
    logger, handler = logging.getLogger("ledger.events"), LogRecords(logging.DEBUG)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def logged(captured: LogRecords, event: str) -> list[dict[str, Any]]:
    """The fields of every `event` line the ledger logged, with its level."""
    return [
        {"level": record.levelname, **fields}
        for record in captured.records
        if (fields := getattr(record, "event_fields", None)) is not None and fields.get("event") == event
    ]
