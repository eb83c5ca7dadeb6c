"""The command line's delivery `auto` pieces: `--deadline`, read once for a whole file; how a
job's requests were answered and what batches saved (`status --json`, `report`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ledger.console import fail, out, settings_or_exit, text_of
from ledger.deadlines import parse_deadline
from ledger.settings import Settings
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


def job_delivery_json(store: Any, settings: Settings, job_id: str) -> dict[str, Any]:
    """A job's deadline, its answers by path (`answered_via`), how many came after the deadline
    (`late`), its cost and what it would have cost all online (`saved_usd`: the difference)."""
    from ledger.savings import job_savings

    return {**store.job_delivery(job_id), **job_savings(store.job_costs(job_id), settings.prices)}


def print_job_cost(store: Any, job_id: str) -> None:
    """`cost: $1.20 (all online $2.10: $0.90 saved by provider batches); 180 via batch, 20 online, 0 late`."""
    said = job_delivery_json(store, settings_or_exit(), job_id)
    line = f"cost: ${said['cost_usd']:.4f}"
    if said["saved_usd"] > 0:
        line += f" (all online ${said['all_online_usd']:.4f}: ${said['saved_usd']:.4f} saved by provider batches)"
    paths = ", ".join(f"{n} via {path}" for path, n in sorted(said["answered_via"].items()))
    if paths:
        line += f"; {paths}"
    if said["deadline"] is not None:
        line += f"; deadline {text_of(said['deadline'])}, {said['late']} answered late"
    out.print(line, highlight=False, soft_wrap=True)
