"""The `ledger` command line: enqueue, run the daemon, audit, and the mock provider.

Every failure an operator can cause (a bad setting, a bad input line, an
unreachable database) ends in one line on stderr and exit status 2, never a
traceback.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ledger.cli_delivery import deadline_option, file_specs, job_delivery_json, print_estimate
from ledger.cli_jobs import register_job_commands
from ledger.cli_mock import register_mock_command
from ledger.cli_pools import register_pool_commands
from ledger.console import (
    err,
    fail,
    json_default,
    open_ledger,
    open_store,
    operator_errors,
    out,
    require_ledger,
    settings_or_exit,
    text_of,
)
from ledger.enqueue import Defaults, dropped_warnings
from ledger.settings import Settings
from ledger.statuses import DeliveryChoice, RequestStatus

app = typer.Typer(
    name="ledger",
    help="A durable request ledger for LLM pipelines: queue requests in SQL, "
    "call providers under bounded slots, audit every call.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's plain help: a flag reads `--json`, where Typer's rich panels print `--json <bool>`
    # (as if it took a value) for every flag, --help included.
    rich_markup_mode=None,
)


@app.command()
def migrate() -> None:
    """Upgrade the database at LEDGER_DATABASE_URL to the latest schema (safe to repeat)."""
    from ledger.store.schema import make_engine, upgrade

    settings = settings_or_exit()
    with operator_errors():
        engine, _ = make_engine(settings.database_url)
        applied = upgrade(engine)
        engine.dispose()
    out.print("schema upgraded to head" if applied else "schema already at head")


@app.command()
def enqueue(
    file: Annotated[
        Path,
        typer.Argument(
            help="JSONL: OpenAI Batch input lines or bare chat request bodies ('-': standard input).",
            show_default=False,
        ),
    ],
    provider: Annotated[
        str | None,
        typer.Option(help="Provider for every line (openai, anthropic, azure, gemini, openai-compatible, mock)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model for every line (overrides the file).")] = None,
    delivery: Annotated[
        DeliveryChoice | None,
        typer.Option(
            help="online: called by the daemon; batch: sent in provider batch jobs; auto: a batch, finished"
            " online by --deadline."
        ),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(help="With --delivery auto: a duration (90s, 45m, 6h, 2d) or an ISO-8601 time (default 24h)."),
    ] = None,
    job: Annotated[str | None, typer.Option(help="Job id the requests belong to.")] = None,
    priority: Annotated[int | None, typer.Option(help="Higher runs sooner (default 0).")] = None,
    parse: Annotated[
        str | None,
        typer.Option(help="Parse every answer as it comes: verdict (reasoning + VERDICT line) or json."),
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option("--no-cache", help="Call the provider for every line, even one the ledger has answered before."),
    ] = False,
    estimate: Annotated[
        bool, typer.Option("--estimate", help="Write nothing: print what the file would cost at most, and cache hits.")
    ] = False,
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
    for line in dropped_warnings(result.dropped):
        err.print(f"warning: {line}", highlight=False, soft_wrap=True, markup=False)
    hits = f", {result.cached} answered from the cache" if result.cached else ""
    twins = f", {result.twins} waiting for an identical request in flight" if result.twins else ""
    dup = f", {result.duplicates} already queued (skipped)" if result.duplicates else ""
    out.print(f"enqueued {result.inserted} request(s){hits}{twins}{dup}; {result.queue_depth} queued in total")


@app.command("requests")
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


@app.command()
def show(
    request_id: Annotated[int, typer.Argument(help="The request's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show one request with all its attempts."""
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
        batch_row = store.get_batch(found["batch_id"])
        if batch_row is not None:
            provider_id = text_of(batch_row["provider_batch_id"])
            out.print(
                f"[bold]batch[/]: {batch_row['id']} ({batch_row['provider']} {provider_id}, "
                f"{batch_row['status']}; see ledger batches)",
                highlight=False,
            )
    for key, value in found.items():
        if value is not None and key not in _SHOWN_APART:
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


# What `show` prints in its own lines, after the columns: the answer and its usage.
_SHOWN_APART = frozenset(
    {
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "finish_reason",
        "provider_finish_reason",
        "tool_calls",
        "refusal",
        "thinking",
        "response",
        "sources",
    }
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


@app.command()
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


@app.command()
def status(
    job: Annotated[str | None, typer.Option(help="Only this job's counts.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Active jobs, requests per status, slots busy/total per pool, budget left today, job capacity."""
    from ledger.cli_jobs import job_status, print_job_status

    settings = settings_or_exit()
    store = open_ledger(settings)
    counts = store.status_counts(job)
    usage = store.pool_usage()
    busy = sum(u["running"] for u in usage.values())
    hits, saved = store.cache_hits_today()
    if as_json:
        said = {
            "requests": counts,
            "slots": {
                "global": {"busy": busy, "total": settings.max_concurrent_llm_calls},
                "pools": {
                    endpoint: {
                        "busy": u["running"],
                        "total": settings.pool_limit(endpoint),
                        "queued": u["queued"],
                        "paused_until": u["paused_until"],
                        "paused_reason": u["paused_reason"],
                    }
                    for endpoint, u in sorted(usage.items())
                },
            },
            **job_status(store, settings),
            "cache": {"hits_today": hits, "saved_usd_today": round(saved, 10)},
        }
        if job is not None:
            said["job"] = job_delivery_json(store, settings, job)
        out.print_json(json.dumps(said, default=json_default))
        return
    print_job_status(job_status(store, settings))
    out.print("requests: " + ", ".join(f"{k} {v}" for k, v in counts.items()), highlight=False)
    if hits:
        out.print(f"cache: {hits} answered from the cache today, ${saved:.4f} not spent again", highlight=False)
    unpriced = store.unpriced_count(job)
    if unpriced:
        out.print(
            f"{unpriced} completed request(s) have no cost: their models are not in the price table "
            "(add them with LEDGER_PRICES_FILE)",
            highlight=False,
        )
    pending = store.cancel_pending(job)
    if pending:
        line = f"{pending} running with a cancel pending: they end canceled when their call returns"
        out.print(line, highlight=False)
    out.print(f"slots: {busy}/{settings.max_concurrent_llm_calls} busy (global)", highlight=False)
    table = Table("pool", "busy/limit", "learned limit (after 429s)", "queued", "cooldown until")
    for endpoint, u in sorted(usage.items()):
        table.add_row(
            endpoint,
            f"{u['running']}/{settings.pool_limit(endpoint)}",
            text_of(u["learned_limit"]),
            str(u["queued"]),
            text_of(u["cooldown_until"]),
        )
    out.print(table)
    for endpoint, u in sorted(usage.items()):
        if u["paused_reason"]:
            out.print(
                f"pool {endpoint} paused until {text_of(u['paused_until'])}: {u['paused_reason']} "
                f"(ledger pools resume {endpoint} lifts it)",
                highlight=False,
                soft_wrap=True,
            )


pools_app = typer.Typer(
    help="Endpoint pools: what holds them back, and lifting a pause.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(pools_app, name="pools")
register_pool_commands(pools_app)


@pools_app.command("resume")
def resume_pool(
    pool: Annotated[str, typer.Argument(help="The pool (provider:model, as `ledger status` names it).")],
) -> None:
    """Lift a pool's pause (its provider said the quota or balance was spent) at once."""
    store = open_ledger(settings_or_exit())
    with operator_errors():
        resumed = store.resume_pool(pool)
    if not resumed:
        fail(f"pool {pool!r} is not paused", code=1)
    out.print(f"pool {pool} resumed: its requests are claimed again", highlight=False)


@app.command()
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
    from ledger.batches import cancel_batches

    if not request_ids and not job and batch is None:
        fail("give request ids, --job or --batch")
    settings = settings_or_exit()
    store = open_ledger(settings)
    if batch is not None and store.get_batch(batch) is None:
        fail(f"no batch with id {batch}", code=1)
    if job and store.cancel_job(job):
        out.print(f"job {job} canceled; other jobs go on", highlight=False, soft_wrap=True)
    if request_ids or job:
        result = store.cancel(ids=request_ids or None, job_id=job)
        line = f"canceled {result.canceled} request(s)"
        if result.in_flight:
            line += f"; {result.in_flight} with a call in flight end canceled when the call returns"
        out.print(line, highlight=False, soft_wrap=True)
    if batch is not None or job:
        with operator_errors():
            said = cancel_batches(store, settings, batch_id=batch, job_id=job)
        for line in said:
            out.print(line, highlight=False, soft_wrap=True)
        if batch is not None and not said:
            out.print(f"batch {batch} is already over; nothing to cancel", highlight=False)


@app.command()
def batches(
    limit: Annotated[int, typer.Option(help="At most this many batches, newest first.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List provider batch jobs: status (ledger's and provider's), requests, failures, age, cost."""
    store = open_ledger(settings_or_exit())
    found = store.list_batches(limit)
    if as_json:
        for b in found:
            line = {
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
            sys.stdout.write(json.dumps(line, default=json_default) + "\n")
        return
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
    out.print(table)


@app.command()
def daemon(
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit 0 once nothing is queued or in flight.")
    ] = False,
    worker_id: Annotated[
        str | None,
        typer.Option(
            help="Lease owner name, unique among live daemons (default host:pid:random). "
            "A restart under the same id takes back at once what the previous process held."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus metrics on this port at /metrics (LEDGER_METRICS_PORT; 0: a free port, "
            "named in the start event).",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option(help="Address the metrics listen on (LEDGER_METRICS_HOST, default 127.0.0.1).")
    ] = None,
) -> None:
    """Claim queued requests under bounded slots and call the providers, until stopped."""
    import anyio

    from ledger.daemon import DatabaseFailed, run_daemon

    overrides = {"metrics_port": metrics_port, "metrics_host": metrics_host}
    settings = settings_or_exit(**{name: value for name, value in overrides.items() if value is not None})
    configure_logs(settings)
    with operator_errors():
        try:
            report = anyio.run(lambda: run_daemon(settings, until_idle=until_idle, worker_id=worker_id))
        except DatabaseFailed as exc:
            err.print(str(exc), highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(1) from None
    err.print(
        f"daemon stopped: {report.claimed} claimed, {report.released_at_stop} released at stop, {report.wall_s:.1f}s",
        highlight=False,
    )


@app.command()
def web(
    host: Annotated[
        str, typer.Option(help="Address to listen on; other than loopback it needs LEDGER_WEB_TOKEN.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one, named on the first line).")] = 8765,
    allow_actions: Annotated[
        bool,
        typer.Option("--allow-actions", help="Offer cancel job, cancel batch and resume pool (POST, CSRF-checked)."),
    ] = False,
) -> None:
    """Serve the live web view of the ledger: jobs and their score matrix, requests with every attempt, pools,
    batches, spend. Its first line on stdout is `ledger web: http://HOST:PORT/`."""
    from ledger.web.server import WebRefused, serve

    settings = settings_or_exit()
    require_ledger(settings)
    try:
        with operator_errors():
            serve(settings, host=host, port=port, allow_actions=allow_actions, token=settings.web_token or None)
    except WebRefused as exc:
        err.print(str(exc), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None


register_mock_command(app)


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option(help="Where the demo's SQLite ledger (and daemon logs) go.")] = Path(
        "ledger-demo"
    ),
    limit: Annotated[int, typer.Option(help="MAX_CONCURRENT_LLM_CALLS for the run.")] = 5,
    latency: Annotated[float, typer.Option(help="Mock provider seconds per call.")] = 0.3,
    daemons: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Run the job with N daemon processes on one PostgreSQL (LEDGER_DATABASE_URL, "
            "or an embedded server from ledger[postgres]).",
        ),
    ] = None,
    kill_one: Annotated[
        bool, typer.Option("--kill-one", help="With --daemons: SIGKILL one daemon mid-job; the others take over.")
    ] = False,
) -> None:
    """Run the example evaluation job keyless: 3 judges x 10 dimensions against the mock provider, limit 5."""
    from ledger.cli_jobs import print_scores

    if daemons is not None:
        _scale_demo(workdir, daemons, limit, latency, kill_one)
        return
    from ledger.demo import run_demo

    with operator_errors():
        summary = run_demo(workdir, limit=limit, latency=latency)
    table = Table("completed", "errors", "retries", "max in flight (provider)", "limit", "wall time")
    table.add_row(
        str(summary["completed"]),
        str(summary["errors"]),
        str(summary["retries"]),
        str(summary["max_in_flight"]),
        str(limit),
        f"{summary['wall_s']:.2f}s",
    )
    out.print(table)
    settings = settings_or_exit(LEDGER_DATABASE_URL=f"sqlite:///{summary['database']}")
    print_scores(open_store(settings), summary["job_id"])
    # Commands that read the demo's ledger as shown, from any directory (not ./ledger.db).
    url = f"sqlite:///{Path(summary['database']).resolve()}"
    on_it = f"LEDGER_DATABASE_URL={shlex.quote(url)}"
    out.print(f"ledger: {summary['database']}; read it with:", highlight=False, soft_wrap=True)
    for command in (f"ledger report {summary['job_id']}", "ledger requests", "ledger show 1"):
        out.print(f"  {on_it} {command}", highlight=False, markup=False, soft_wrap=True)
    out.print(f"see it in a browser: {on_it} ledger web", highlight=False, markup=False, soft_wrap=True)


def _scale_demo(workdir: Path, daemons: int, limit: int, latency: float, kill_one: bool) -> None:
    from ledger.demo_scale import DemoDatabaseUnavailable, run_scale_demo

    settings = settings_or_exit()
    try:
        with operator_errors():
            summary = run_scale_demo(
                workdir, daemons=daemons, url=settings.database_url, limit=limit, latency=latency, kill_one=kill_one
            )
    except DemoDatabaseUnavailable as exc:
        fail(str(exc))
    table = Table("daemon", "requests answered", "takeovers", "exit", title=f"{daemons} daemons, one PostgreSQL")
    for row in summary["rows"]:
        table.add_row(row["daemon"], str(row["answered"]), str(row["takeovers"]), row["exit"])
    out.print(table)
    out.print(
        f"provider max in flight: {summary['max_in_flight']} (global limit {summary['limit']}); "
        f"job {summary['job_id']} {summary['job_status']}, {summary['completed']} requests completed "
        f"in {summary['wall_s']:.1f}s",
        highlight=False,
        soft_wrap=True,
    )
    out.print(f"ledger: {summary['database']}  (daemon logs in {workdir})", highlight=False, soft_wrap=True)


def configure_logs(settings: Settings) -> None:
    from ledger.events import configure_logging

    configure_logging(settings.log_level)


register_job_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
