"""The `ledger` command line: enqueue, run the daemon, audit, and the mock provider.

Every failure an operator can cause (a bad setting, a bad input line, an
unreachable database) ends in one line on stderr and exit status 2, never a
traceback.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ledger.cli_batches import register_batch_commands
from ledger.cli_jobs import register_job_commands
from ledger.cli_mock import register_mock_command
from ledger.cli_pools import register_pool_commands
from ledger.cli_requests import register_request_commands
from ledger.cli_status import register_status_command
from ledger.console import (
    configure_logs,
    err,
    fail,
    open_ledger,
    open_store,
    operator_errors,
    out,
    require_ledger,
    settings_or_exit,
)

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


register_request_commands(app)
register_status_command(app)

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


register_batch_commands(app)


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


register_job_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
