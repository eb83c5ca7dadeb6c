"""The command line as a new user meets it: the demo, help, and one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger.cli import app

LEDGER = [sys.executable, "-m", "ledger.cli"]
COMMANDS = [
    "migrate",
    "enqueue",
    "requests",
    "show",
    "export",
    "status",
    "cancel",
    "batches",
    "daemon",
    "mock-provider",
    "demo",
    "eval",
    "report",
    "reparse",
    "web",
]


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LEDGER, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_demo_runs_the_seed_case_within_the_limit(tmp_path: Path) -> None:
    result = run("demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    row = re.search(r"│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*5\s*│", result.stdout)
    assert row, result.stdout
    completed, errors, _retries, max_in_flight = map(int, row.groups())
    assert (completed, errors, max_in_flight) == (30, 0, 5)
    assert (tmp_path / "ledger-demo" / "ledger.db").exists()
    # The example job's scores: 10 dimension rows, a score from each of the 3 judges.
    assert "example-eval: completed" in result.stdout
    scored = re.findall(r"│ [a-z_]+\s*│\s*([1-5])\s*│\s*([1-5])\s*│\s*([1-5])\s*│", result.stdout)
    assert len(scored) == 10, result.stdout
    # It ends by naming the web view of its ledger.
    database = (tmp_path / "ledger-demo" / "ledger.db").resolve()
    assert (
        result.stdout.strip().splitlines()[-1]
        == f"see it in a browser: LEDGER_DATABASE_URL=sqlite:///{database} ledger web"
    )


def test_help_reads_well_for_every_command() -> None:
    top = run("--help")  # the installed command, as a user runs it
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
        # Each command's own help in process: the same text, without a process start per command.
        sub = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "100"})
        assert sub.exit_code == 0 and "Usage:" in sub.stdout, command
        lines = [line.strip() for line in sub.stdout.splitlines() if line.strip()]
        description = lines[lines.index(next(x for x in lines if x.startswith("Usage:"))) + 1]
        assert len(description) > 20, (command, description)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAX_CONCURRENT_LLM_CALLS": "0"}, "MAX_CONCURRENT_LLM_CALLS must be >= 1, got 0"),
        ({"MAX_CONCURRENT_LLM_CALLS": "500"}, "MAX_CONCURRENT_LLM_CALLS must be <= 50, got 500"),
        ({"RETRY_MAX_ATTEMPTS": "many"}, "RETRY_MAX_ATTEMPTS"),
        ({"LEDGER_DATABASE_URL": "mysql://nope"}, "LEDGER_DATABASE_URL: unsupported database"),
        ({"LEDGER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}, "cannot open database"),
        # libpq's two sentences, each on its own line there, keep their full stop on one line.
        ({"LEDGER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none"}, "Connection refused. Is the server"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(tmp_path: Path, env: dict[str, str], message: str) -> None:
    result = run("daemon", "--until-idle", env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_demo_with_daemons_shares_the_limit_and_takes_over_a_killed_daemon(pg_url: str, tmp_path: Path) -> None:
    result = run("demo", "--daemons", "2", "--kill-one", cwd=tmp_path, env={"LEDGER_DATABASE_URL": pg_url})
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"│ (demo-daemon-\d)\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*([^│]+?)\s*│", result.stdout)
    assert [r[0] for r in rows] == ["demo-daemon-1", "demo-daemon-2"], result.stdout
    assert sum(int(r[1]) for r in rows) == 30  # every request answered exactly once, across daemons
    assert rows[0][3] == "killed (SIGKILL)" and rows[1][3] == "0"
    said = r"provider max in flight: (\d+) \(global limit 5\); job example-eval completed"
    in_flight = re.search(said, result.stdout)
    assert in_flight and int(in_flight.group(1)) <= 5, result.stdout


def test_demo_with_daemons_starts_its_own_postgresql_when_none_is_named(tmp_path: Path) -> None:
    result = run("demo", "--daemons", "2", cwd=tmp_path)  # LEDGER_DATABASE_URL unset: the SQLite default
    assert result.returncode == 0, result.stderr[-2000:]
    rows = re.findall(r"│ (demo-daemon-\d)\s*│\s*(\d+)\s*│", result.stdout)
    assert len(rows) == 2 and sum(int(n) for _, n in rows) == 30, result.stdout
    assert "an embedded server, removed at the end" in result.stdout
