"""`ledger cancel` (requests, a job, a provider batch) and `ledger batches` (the provider batch
jobs, newest first)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from ledger.console import fail, json_default, open_ledger, operator_errors, out, settings_or_exit, text_of


def register_batch_commands(app: typer.Typer) -> None:
    app.command()(cancel)
    app.command()(batches)


def cancel(
    request_ids: Annotated[list[int] | None, typer.Argument(help="Request ids to cancel.")] = None,
    job: Annotated[
        str | None, typer.Option(help="Cancel every unfinished request of this job, and its provider batches.")
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(help="Cancel this provider batch (ledger id) at the provider; finished results are kept."),
    ] = None,
) -> None:
    """Cancel requests that are not final yet (a call in flight keeps its slot until it returns)."""
    from ledger.cancel import cancel as cancel_all

    if not request_ids and not job and batch is None:
        fail("give request ids, --job or --batch")
    settings = settings_or_exit()
    store = open_ledger(settings)
    if batch is not None and store.get_batch(batch) is None:
        fail(f"no batch with id {batch}", code=1)
    with operator_errors():
        for line in cancel_all(store, settings, ids=request_ids, job_id=job, batch_id=batch):
            out.print(line, highlight=False, soft_wrap=True)


def batches(
    limit: Annotated[int, typer.Option(help="At most this many batches, newest first.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List provider batch jobs: status (ledger's and provider's), requests, failures, age, cost."""
    store = open_ledger(settings_or_exit())
    found = store.list_batches(limit)
    if as_json:
        for b in found:
            sys.stdout.write(json.dumps(_batch_json(b), default=json_default) + "\n")
        return
    out.print(_batch_table(found))


def _batch_json(b: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": b["id"],
        "provider": b["provider"],
        "model": b["model"],
        "provider_batch_id": b["provider_batch_id"],
        "status": b["status"],
        "provider_status": b["provider_status"],
        "total": b["request_total"],
        "completed": b["completed"],
        "failed": b["failed"],
        "age_s": b["age_s"],
        "cost_usd": b["cost_usd"],
    }


def _batch_table(found: list[dict[str, Any]]) -> Table:
    table = Table(
        "id",
        "provider",
        "model",
        "provider batch",
        "status",
        "provider says",
        "total",
        "done",
        "failed",
        "age s",
        "cost $",
        "job",
    )
    for b in found:
        table.add_row(
            str(b["id"]),
            b["provider"],
            b["model"],
            text_of(b["provider_batch_id"]),
            b["status"],
            text_of(b["provider_status"]),
            str(b["request_total"]),
            str(b["completed"]),
            str(b["failed"]),
            f"{b['age_s']:.0f}",
            "" if b["cost_usd"] is None else f"{b['cost_usd']:.4f}",
            text_of(b["job_id"]),
        )
    return table
