"""The command line's delivery `auto` pieces: `--deadline`, read once for a whole file."""

from __future__ import annotations

from datetime import datetime

from ledger.console import fail
from ledger.deadlines import parse_deadline
from ledger.statuses import DeliveryChoice


def deadline_option(given: str | None, delivery: DeliveryChoice | None) -> datetime | None:
    """`--deadline` as a UTC time (a duration counts from now), or exit 2 with one line: a value
    that is neither a duration nor an ISO time, or a deadline without `--delivery auto`."""
    if given is None:
        return None
    if delivery != DeliveryChoice.AUTO:
        fail("--deadline: only with --delivery auto")
    try:
        return parse_deadline(given)
    except ValueError as exc:
        fail(f"--{exc}")
