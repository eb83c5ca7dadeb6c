"""`ledger enqueue`, `ledger requests`, `ledger show` and `ledger export`: requests in and out of
the ledger, one at a time or all of them (the commands `cli.py` registers first)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ledger.cli_delivery import deadline_option, file_specs, print_estimate
from ledger.console import (
    configure_logs,
    err,
    fail,
    json_default,
    open_ledger,
    open_store,
    operator_errors,
    out,
    settings_or_exit,
    text_of,
)
from ledger.enqueue import Defaults, dropped_warnings
from ledger.statuses import DeliveryChoice, RequestStatus

if TYPE_CHECKING:
    from ledger.store import EnqueueResult


# `ledger enqueue`'s longer options, named here so that the command's signature reads at a glance.
_FileArgument = Annotated[
    Path,
    typer.Argument(
        help="JSONL: OpenAI Batch input lines or bare chat request bodies ('-': standard input).",
        show_default=False,
    ),
]
_ProviderOption = Annotated[
    str | None,
    typer.Option(help="Provider for every line (openai, anthropic, azure, gemini, openai-compatible, mock)."),
]
_DeliveryOption = Annotated[
    DeliveryChoice | None,
    typer.Option(
        help="online: called by the daemon; batch: sent in provider batch jobs; auto: a batch, finished"
        " online by --deadline."
    ),
]
_DeadlineOption = Annotated[
    str | None,
    typer.Option(help="With --delivery auto: a duration (90s, 45m, 6h, 2d) or an ISO-8601 time (default 24h)."),
]
_ParseOption = Annotated[
    str | None,
    typer.Option(help="Parse every answer as it comes: verdict (reasoning + VERDICT line) or json."),
]
_NoCacheOption = Annotated[
    bool,
    typer.Option("--no-cache", help="Call the provider for every line, even one the ledger has answered before."),
]
_EstimateOption = Annotated[
    bool, typer.Option("--estimate", help="Write nothing: print what the file would cost at most, and cache hits.")
]


def register_request_commands(app: typer.Typer) -> None:
    app.command()(enqueue)
    app.command("requests")(list_requests)
    app.command()(show)
    app.command()(export)


def enqueue(
    file: _FileArgument,
    provider: _ProviderOption = None,
    model: Annotated[str | None, typer.Option(help="Model for every line (overrides the file).")] = None,
    delivery: _DeliveryOption = None,
    deadline: _DeadlineOption = None,
    job: Annotated[str | None, typer.Option(help="Job id the requests belong to.")] = None,
    priority: Annotated[int | None, typer.Option(help="Higher runs sooner (default 0).")] = None,
    parse: _ParseOption = None,
    no_cache: _NoCacheOption = False,
    estimate: _EstimateOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --estimate: print one JSON object.")] = False,
) -> None:
    """Queue every line of FILE; lines seen before (same custom_id, same body) are skipped.

    The whole file is checked before anything is written: a bad line, or a custom_id used
    with a different body (in the file or in the ledger), exits 2 naming FILE:LINE.
    """
    from ledger.api import announce
    from ledger.enqueue import STDIN
    from ledger.intake import enqueue_file

    if file != STDIN and not file.is_file():
        fail(f"{file}: {'is a directory, not a file' if file.is_dir() else 'no such file'}")
    settings = settings_or_exit()
    configure_logs(settings)
    deadline_at = deadline_option(deadline, delivery)  # before the store: a bad flag opens nothing
    if parse is not None and parse not in ("verdict", "json"):
        fail(f"--parse: unknown parser {parse!r} (known: verdict, json)")
    defaults = Defaults(
        provider=provider,
        model=model,
        delivery=delivery,
        deadline=deadline_at,
        job_id=job,
        priority=priority,
        parse=parse,
        cache=False if no_cache else None,
    )
    if estimate:  # writes nothing, and opens an existing ledger only
        print_estimate(file_specs(file, defaults, settings), settings, as_json)
        return
    store = open_store(settings)
    with operator_errors():
        result = enqueue_file(store, settings, file, defaults)
    announce(result)
    _print_enqueued(result)


def _print_enqueued(result: EnqueueResult) -> None:
    for line in dropped_warnings(result.dropped):
        err.print(f"warning: {line}", highlight=False, soft_wrap=True, markup=False)
    hits = f", {result.cached} answered from the cache" if result.cached else ""
    twins = f", {result.twins} waiting for an identical request in flight" if result.twins else ""
    dup = f", {result.duplicates} already queued (skipped)" if result.duplicates else ""
    out.print(f"enqueued {result.inserted} request(s){hits}{twins}{dup}; {result.queue_depth} queued in total")


def list_requests(
    status: Annotated[RequestStatus | None, typer.Option(help="Only requests in this status.")] = None,
    job: Annotated[str | None, typer.Option(help="Only requests of this job.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many rows.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List requests with their status, attempts, last status code and usage."""
    store = open_ledger(settings_or_exit())
    rows = store.list_requests(status=status.value if status else None, job_id=job, limit=limit)
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row, default=json_default) + "\n")
        return
    table = Table("id", "key", "job", "model", "status", "attempts", "last code", "tokens in/out", "ms")
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["idempotency_key"][:28],
            r["job_id"] or "",
            r["model"],
            r["status"],
            str(r["attempts"]),
            text_of(r["last_status_code"]),
            f"{text_of(r['input_tokens'])}/{text_of(r['output_tokens'])}",
            text_of(r["latency_ms"]),
        )
    out.print(table)


def show(
    request_id: Annotated[int, typer.Argument(help="The request's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one request with all its attempts."""
    from ledger.store.answers import ANSWER_FIELDS

    # Printed in lines of their own, after the columns: the answer and its usage, its sources.
    shown_apart = {"input_tokens", "output_tokens", *ANSWER_FIELDS, "sources"}
    store = open_ledger(settings_or_exit())
    found = store.get_request(request_id)
    if found is None:
        fail(f"no request with id {request_id}", code=1)
    if as_json:
        sys.stdout.write(json.dumps(found, default=json_default, indent=2) + "\n")
        return
    attempts = found.pop("attempt_rows")
    lineage = store.sources_of(request_id)
    if found.get("batch_id") is not None:
        _print_batch(store.get_batch(found["batch_id"]))
    for key, value in found.items():
        if value is not None and key not in shown_apart:
            # One line each, as stored: a request's conversation is printed whole, never wrapped,
            # and brackets in it are not styling.
            out.print(Text.assemble((key, "bold"), f": {text_of(value)}"), highlight=False, soft_wrap=True)
    _print_answer(found)
    if lineage["sources"] or lineage["built_from_it"]:
        out.print(f"sources: {', '.join(map(str, lineage['sources'])) or '-'}", highlight=False)
        out.print(f"built from it: {', '.join(map(str, lineage['built_from_it'])) or '-'}", highlight=False)
    table = Table("attempt", "outcome", "status", "error", "latency ms", "retry in", "started", "worker", "batch")
    for a in attempts:
        table.add_row(
            str(a["attempt"]),
            a["outcome"],
            text_of(a["status_code"]),
            text_of(a["error_code"]),
            text_of(a["latency_ms"]),
            "" if a["retry_delay_s"] is None else f"{a['retry_delay_s']:.1f} s",
            text_of(a["started_at"]),
            text_of(a["worker"]),
            text_of(a["batch_id"]),
        )
    out.print(table)


def _print_batch(batch_row: dict[str, Any] | None) -> None:
    if batch_row is not None:
        provider_id = text_of(batch_row["provider_batch_id"])
        out.print(
            f"[bold]batch[/]: {batch_row['id']} ({batch_row['provider']} {provider_id}, "
            f"{batch_row['status']}; see ledger batches)",
            highlight=False,
        )


def _print_answer(found: dict[str, Any]) -> None:
    """The answer's fields beside its text: why it ended, tool calls, refusal, thinking, usage.
    What a model wrote is printed as it is (`markup=False`): brackets in it are not styling."""
    if found.get("finish_reason") is not None:
        said = text_of(found.get("provider_finish_reason"))
        out.print(
            f"finish_reason: {found['finish_reason']} (provider: {said})", highlight=False, markup=False, soft_wrap=True
        )
    for call in found.get("tool_calls") or []:
        line = f"tool call: {call.get('name')}({call.get('arguments')}) id {call.get('id')}"
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    for key in ("refusal", "thinking"):
        if found.get(key) is not None:
            out.print(f"{key}: {text_of(found[key])}", highlight=False, markup=False, soft_wrap=True)
    if found.get("input_tokens") is not None or found.get("output_tokens") is not None:
        out.print(f"usage: {usage_line(found)}", highlight=False, soft_wrap=True)
    if found.get("response") is not None:
        size = len(json.dumps(found["response"]))
        out.print(
            f"response: the provider's body, {size} bytes as JSON (ledger show --json, ledger export --full)",
            highlight=False,
        )


def usage_line(row: dict[str, Any]) -> str:
    """`input 1200 (cached 1024, cache writes 0), output 300 (reasoning 64)`, with what is known."""
    inside = [
        f"{label} {row[key]}"
        for key, label in (("cached_input_tokens", "cached"), ("cache_write_tokens", "cache writes"))
        if row.get(key) is not None
    ]
    line = f"input {text_of(row.get('input_tokens'))}" + (f" ({', '.join(inside)})" if inside else "")
    line += f", output {text_of(row.get('output_tokens'))}"
    if row.get("reasoning_tokens") is not None:
        line += f" (reasoning {row['reasoning_tokens']})"
    return line


def export(
    job: Annotated[str | None, typer.Option(help="Only requests of this job.")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write here instead of stdout.")] = None,
    full: Annotated[bool, typer.Option("--full", help="Add `response`: the provider's body as received.")] = False,
) -> None:
    """Export results as JSONL: custom_id, status, output, tool calls, finish reason, parsed fields, usage, cost."""
    store = open_ledger(settings_or_exit())
    target = out_file.open("w", encoding="utf-8") if out_file else sys.stdout
    count = 0
    try:
        for row in store.export_rows(job_id=job, with_response=full):
            line = export_line(row)
            if full:
                line["response"] = row["response"]
            target.write(json.dumps(line, default=json_default) + "\n")
            count += 1
    finally:
        if out_file:
            target.close()
    if out_file:
        out.print(f"exported {count} request(s) to {out_file}")


def export_line(row: dict[str, Any]) -> dict[str, Any]:
    error = None
    if row["status"] == RequestStatus.ERROR.value:
        error = {
            "code": row["error_code"],
            "message": row["error_message"],
            "status_code": row["last_status_code"],
        }
    return {
        "custom_id": row["idempotency_key"],
        "id": row["id"],
        "job_id": row["job_id"],
        "status": row["status"],
        "model": row["model"],
        "api": row["api"],
        "output": row["raw_output"],
        "finish_reason": row["finish_reason"],
        "provider_finish_reason": row["provider_finish_reason"],
        "tool_calls": row["tool_calls"],
        "refusal": row["refusal"],
        "thinking": row["thinking"],
        "reasoning": row["reasoning"],
        "verdict_text": row["verdict_text"],
        "parsed_verdict": row["parsed_verdict"],
        "parse_error": row["parse_error"],
        "parsed": row["parsed"],
        "sources": row["sources"],
        "cached_from": row["cached_from"],
        "sample": row["sample"],
        "dropped_params": row["dropped_params"],
        "usage": {
            "input_tokens": row["input_tokens"],
            "output_tokens": row["output_tokens"],
            "cached_input_tokens": row["cached_input_tokens"],
            "cache_write_tokens": row["cache_write_tokens"],
            "reasoning_tokens": row["reasoning_tokens"],
        },
        "cost_usd": row["cost_usd"],
        "answered_via": row["answered_via"],
        "deadline": row["deadline"],
        "attempts": row["attempts"],
        "latency_ms": row["latency_ms"],
        "error": error,
        "trace": row["trace"],
    }
