"""Delivery `auto`: a request's deadline, read from what a user writes, and the path it starts on.

An `auto` request goes into a provider batch (at the discount) when its provider has a batch
API, and online at once when it has none; the batch worker takes it out of its batch at its
deadline less LEDGER_DEADLINE_MARGIN_SECONDS and calls it online (ledger/batches.py). Kept
apart from `ledger.enqueue` so the command line can check a `--deadline` without the rest.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from adapters.registry import BATCH_PROVIDERS
from ledger.statuses import Delivery, DeliveryChoice

# Without a deadline, `auto` means this: a provider batch's own window (OpenAI's, Anthropic's).
DEFAULT_AUTO_DEADLINE = timedelta(hours=24)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")


def parse_deadline(value: str | datetime, now: datetime | None = None) -> datetime:
    """A deadline as a UTC time: a duration from now (`90s`, `45m`, `6h`, `2d`) or an ISO-8601
    time (one without a zone is UTC). ValueError, naming what was given, for anything else."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if not isinstance(value, str):
        raise ValueError(f"deadline must be a duration (90s, 45m, 6h, 2d) or an ISO-8601 time, got {value!r}")
    found = _DURATION.match(value)
    if found is not None:
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
        return (now or datetime.now(UTC)) + timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"deadline must be a duration (90s, 45m, 6h, 2d) or an ISO-8601 time, got {value!r}") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def stored_delivery(choice: DeliveryChoice, provider: str, deadline: datetime | None) -> tuple[str, datetime | None]:
    """The `delivery` column's value and the `deadline` to store for a request asked for as
    `choice`: `auto` starts in a batch where the provider has a batch API, online where not,
    its deadline 24 hours away unless given; the other two store no deadline."""
    if choice != DeliveryChoice.AUTO:
        return Delivery(choice.value).value, None
    path = Delivery.BATCH if provider in BATCH_PROVIDERS else Delivery.ONLINE
    return path.value, deadline or datetime.now(UTC) + DEFAULT_AUTO_DEADLINE


def deadline_text(when: datetime, dialect_name: str) -> str:
    """A deadline as the text an enqueue's multi-row insert writes: on SQLite the form the
    database clock's own timestamps take (so comparisons with it are right), on PostgreSQL an
    ISO time with its zone (never read in the session's zone)."""
    utc = when.astimezone(UTC)
    if dialect_name == "sqlite":
        return utc.strftime("%Y-%m-%d %H:%M:%S.%f")
    return utc.isoformat(sep=" ")
