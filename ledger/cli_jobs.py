"""The evaluation-job commands: `ledger eval`, `ledger report`, `ledger reparse`, and job status.

Exit codes: 2 for what an operator can fix in the input (a bad spec, a bad
setting), 3 for a trigger refused by policy (capacity, budget), 1 for an
unknown job.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ledger.cli_delivery import job_delivery_json, job_requests, print_estimate, print_job_cost
from ledger.console import err, fail, json_default, open_ledger, open_store, operator_errors, out, settings_or_exit
from ledger.settings import Settings

REFUSED_EXIT = 3


def register_job_commands(app: typer.Typer) -> None:
    app.command("eval")(eval_job)
    app.command()(report)
    app.command()(reparse)


def eval_job(
    spec_file: Annotated[Path, typer.Argument(help="The job spec (TOML).", show_default=False)],
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="Show progress until the job ends, then its scores; with no daemon alive, run it here."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    estimate: Annotated[
        bool, typer.Option("--estimate", help="Write nothing: print what the job would cost at most, and cache hits.")
    ] = False,
) -> None:
    """Trigger an evaluation job: judges x dimensions over an artifact (refused with exit 3 at capacity or budget)."""
    from ledger.jobs import TriggerRefused, trigger
    from ledger.spec import SpecError, load_spec

    settings = settings_or_exit()
    try:
        spec = load_spec(spec_file)
    except SpecError as exc:
        fail(str(exc))
    if estimate:  # writes nothing, and opens an existing ledger only
        print_estimate(job_requests(spec, settings), settings, as_json)
        return
    store = open_store(settings)
    try:
        with operator_errors():
            staged = trigger(store, settings, spec)
    except TriggerRefused as exc:
        err.print(str(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(REFUSED_EXIT) from None
    said: dict[str, Any] = {"job_id": staged.job_id, "created": staged.created, "requests": staged.requests}
    if not as_json:
        if staged.created:
            line = f"triggered job {staged.job_id}: {staged.requests} requests ({spec.delivery})"
        else:
            line = f"job {staged.job_id} was already triggered ({staged.requests} requests); nothing added"
        out.print(line, highlight=False, soft_wrap=True)
    if wait:
        anyio.run(lambda: follow(settings, store, staged.job_id, show=not as_json))
        job = store.get_job(staged.job_id)
        said["status"] = job["status"] if job else None
        if as_json:
            said["opinions"] = [opinion_json(o) for o in store.opinions(staged.job_id)]
        else:
            print_scores(store, staged.job_id)
    if as_json:
        out.print_json(json.dumps(said, default=json_default))
    if wait and said.get("status") != "completed":  # failed (budget) or canceled: scripts must see it
        raise typer.Exit(1)


async def follow(settings: Settings, store: Any, job_id: str, *, show: bool) -> None:
    """Poll the job until it ends, with a progress bar. With no live daemon on the database,
    run one here until the job is done: on a laptop one command does the whole job."""
    from ledger.daemon import run_daemon

    here = await anyio.to_thread.run_sync(store.live_daemons, settings.lease_seconds) == 0
    stop = anyio.Event()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    async with anyio.create_task_group() as tg:
        if here:
            _quiet_logs(settings)
            tg.start_soon(lambda: run_daemon(settings, until_idle=True, stop=stop))
        with Progress(*columns, console=out, disable=not show, transient=False) as bar:
            task = bar.add_task(job_id, total=None)
            delay = 0.1
            while True:
                job = await anyio.to_thread.run_sync(store.get_job, job_id)
                progress = await anyio.to_thread.run_sync(store.job_progress, job_id)
                phase = job["phase"] if job else "?"
                bar.update(task, total=progress["total"], completed=progress["done"], description=f"{job_id} {phase}")
                if job is None or job["status"] != "running":
                    break
                await anyio.sleep(delay)
                delay = min(delay * 1.5, 1.0)
        stop.set()


def _quiet_logs(settings: Settings) -> None:
    """An in-process daemon under a progress bar logs warnings and errors only (its JSON lines on stderr)."""
    from ledger.events import configure_logging

    configure_logging("WARNING" if settings.log_level in ("DEBUG", "INFO") else settings.log_level)


def report(
    job_id: Annotated[str, typer.Argument(help="The job's id.", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per opinion.")] = False,
) -> None:
    """The job's scores: dimensions x agents (failed cells marked), or its opinions as JSON."""
    settings = settings_or_exit()
    store = open_ledger(settings)
    if store.get_job(job_id) is None:
        fail(f"no job {job_id!r}", code=1)
    if as_json:
        for opinion in store.opinions(job_id):
            out.print(json.dumps(opinion_json(opinion), default=json_default), highlight=False, soft_wrap=True)
        return
    print_scores(store, job_id)


def opinion_json(opinion: dict[str, Any]) -> dict[str, Any]:
    """The fields `report --json` promises, in that order."""
    keys = ("agent", "dimension", "sample", "score", "argument", "request_id", "parse_error")
    return {"job": opinion["job_id"], **{key: opinion[key] for key in keys}}


def score_cell(opinions: list[dict[str, Any]]) -> str:
    """A cell of the score table: the score; with samples, their mean with n and spread (the
    standard deviation of the scores), failed and unparsed samples counted beside it. The cell
    comes from `ledger.scores`, as the web view's matrix does."""
    from ledger.scores import cell_summary, cell_text

    return cell_text(cell_summary(opinions), lambda words: f"[red]{words}[/]")


def print_scores(store: Any, job_id: str) -> None:
    """The table of scores: one row per dimension, one column per agent; `failed` and `unparsed` marked."""
    from ledger.jobs import job_spec

    job = store.get_job(job_id)
    if not isinstance(job.get("spec"), dict) or "job" not in job["spec"]:
        fail(
            f"job {job_id!r} is not an evaluation job (its requests were enqueued with --job); "
            "see ledger requests --job",
            code=1,
        )
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for opinion in store.opinions(job_id):
        cells.setdefault((opinion["agent"], opinion["dimension"]), []).append(opinion)
    spec = job_spec(job)
    agents = [a.name for a in spec.agents]
    title = f"{job_id}: {job['status']}" + (f" ({spec.samples} samples a cell)" if spec.samples > 1 else "")
    table = Table("dimension", *agents, title=title)
    for dimension in spec.dimensions:
        table.add_row(dimension.id, *[score_cell(cells.get((agent, dimension.id), [])) for agent in agents])
    out.print(table)
    print_job_cost(store, job_id)
    truncated = store.job_progress(job_id)["truncated"]
    if truncated:
        out.print(f"{truncated} answers cut off at max_tokens", highlight=False)
        out.print("  (their judges ran out of tokens: raise the agents' max_tokens)", highlight=False)
    errors = job.get("errors") or []
    if errors:
        out.print(f"{len(errors)} error(s):", highlight=False)
        for line in errors:
            out.print(f"  {line}", highlight=False, soft_wrap=True)
    if job.get("error"):
        out.print(f"job {job['status']}: {job['error']}", highlight=False, soft_wrap=True)


def reparse(
    job_id: Annotated[str | None, typer.Argument(help="The job's id (or --job).", show_default=False)] = None,
    job: Annotated[str | None, typer.Option("--job", help="The job whose requests are parsed again.")] = None,
) -> None:
    """Recompute a job's derived fields (and an evaluation's opinions) from stored output: no provider call."""
    from ledger.jobs import is_evaluation, reparse_requests
    from ledger.jobs import reparse as reparse_job

    target = job or job_id
    if target is None or (job is not None and job_id is not None and job != job_id):
        fail("name one job: ledger reparse --job JOB (or ledger reparse JOB)")
    settings = settings_or_exit()
    store = open_ledger(settings)
    try:
        stored = store.get_job(target)
        parsed = reparse_requests(store, target)
        if is_evaluation(stored):
            written = reparse_job(store, target)
            said = f"reparsed job {target}: {written} opinions from stored output, no provider call"
        else:
            said = f"reparsed job {target}: {parsed} request(s) from stored output, no provider call"
    except (LookupError, ValueError) as exc:  # unknown job, or one still running
        fail(str(exc.args[0]) if exc.args else str(exc), code=1)
    out.print(said, highlight=False)


def job_status(store: Any, settings: Settings) -> dict[str, Any]:
    """Active jobs with phase, progress, duration and spend; today's budget; job capacity."""
    from ledger.jobs import job_duration_s

    now = time.time()
    active = []
    for job in store.active_jobs():
        progress = store.job_progress(job["id"])
        duration = job_duration_s(job, now)
        active.append(
            {
                "job_id": job["id"],
                "phase": job["phase"],
                "done": progress["done"],
                "total": progress["total"],
                "duration_s": None if duration is None else round(duration, 1),
                "spent_usd": round(progress["spent_usd"], 6),
                "truncated": progress["truncated"],
                # Pools paused by a spent quota that this job's queued requests wait on.
                "paused_pools": store.job_paused_pools(job["id"]),
                **job_delivery_json(store, settings, job["id"]),
            }
        )
    spent = store.spend_today()
    limit = settings.daily_budget_usd
    return {
        "active_jobs": active,
        "budget": {
            "spent_today_usd": round(spent, 6),
            "daily_limit_usd": limit,
            "remaining_usd": None if limit is None else round(max(limit - spent, 0.0), 6),
        },
        "capacity": {"active": len(active), "limit": settings.job_capacity},
    }


def print_job_status(status: dict[str, Any]) -> None:
    jobs = status["active_jobs"]
    out.print(f"active jobs: {len(jobs)}", highlight=False)
    for job in jobs:
        duration = job["duration_s"] or 0.0
        minutes, seconds = divmod(int(duration), 60)
        out.print(
            f"  {job['job_id']}  {job['phase']:<12} {job['done']}/{job['total']} requests  "
            f"({minutes}m {seconds:02d}s)  ${job['spent_usd']:.4f}"
            + (f"  {job['truncated']} cut off at max_tokens" if job["truncated"] else ""),
            highlight=False,
        )
        for paused in job["paused_pools"]:
            out.print(
                f"    waits on pool {paused['pool']}, paused until {paused['until']}: {paused['reason']}",
                highlight=False,
                soft_wrap=True,
            )
    budget = status["budget"]
    if budget["daily_limit_usd"] is None:
        out.print(f"budget: ${budget['spent_today_usd']:.2f} spent today (no daily limit)", highlight=False)
    else:
        out.print(
            f"budget: ${budget['remaining_usd']:.2f} remaining today "
            f"(${budget['spent_today_usd']:.2f} of ${budget['daily_limit_usd']:.2f} spent)",
            highlight=False,
        )
    capacity = status["capacity"]
    out.print(f"capacity: {capacity['active']}/{capacity['limit']} jobs", highlight=False)
