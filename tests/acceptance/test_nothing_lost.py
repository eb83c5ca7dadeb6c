"""Nothing lost silently: a ledger that would forget, a ledger that is not there, a missing key."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from ledger.store import Store
from tests.acceptance.procs import LEDGER, enqueue, events, ledger_env, mock_provider, run_daemon, write_requests

IN_MEMORY = ["sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared&uri=true"]


def ledger(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEDGER, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("url", IN_MEMORY)
def test_an_in_memory_database_is_refused(url: str, tmp_path: Path) -> None:
    path = write_requests(tmp_path / "in.jsonl", [("a", "d", "hello")])
    result = ledger(ledger_env(url), "enqueue", str(path), "--provider", "mock")
    assert result.returncode == 2
    assert "in-memory SQLite database" in one_line(result)
    assert "enqueued" not in result.stdout


@pytest.mark.parametrize(
    "command", [["migrate"], ["daemon", "--until-idle"], ["status"], ["requests"], ["eval", "spec.toml"], ["web"]]
)
def test_every_command_refuses_an_in_memory_database(command: list[str]) -> None:
    spec = Path(__file__).parents[2] / "ledger" / "data" / "examples" / "eval" / "spec.toml"
    args = [spec.as_posix() if part == "spec.toml" else part for part in command]
    result = ledger(ledger_env("sqlite://"), *args)
    assert result.returncode == 2
    assert "in-memory SQLite database" in one_line(result)


def missing_ledger(db_url: str, tmp_path: Path) -> str:
    """A URL with no ledger behind it: a SQLite file in folders that do not exist, or an empty schema."""
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'not' / 'there' / 'ledger.db'}"
    return db_url


def ledger_tables(url: str) -> list[str]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return list(inspect(conn).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "command",
    [["status"], ["requests"], ["show", "1"], ["report", "example-eval"], ["export"], ["web", "--port", "0"]],
)
def test_reading_a_ledger_that_is_not_there_says_so_and_creates_nothing(
    db_url: str, tmp_path: Path, command: list[str]
) -> None:
    url = missing_ledger(db_url, tmp_path)
    result = ledger(ledger_env(url), *command)
    assert result.returncode == 2, result.stderr
    assert one_line(result).startswith("error: no ledger at ")
    if url.startswith("sqlite"):
        assert not (tmp_path / "not").exists()
    else:
        assert ledger_tables(url) == []


def test_enqueue_still_creates_the_ledger_and_then_it_is_read(db_url: str, tmp_path: Path) -> None:
    url = missing_ledger(db_url, tmp_path)
    path = write_requests(tmp_path / "in.jsonl", [("a", "d", "hello")])
    env = ledger_env(url)
    enqueue(env, path, "--provider", "mock")
    result = ledger(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requests"]["queued"] == 1


def keyless_env(db_url: str, **settings: object) -> dict[str, str]:
    env = ledger_env(db_url, **settings)
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        env.pop(name, None)
    return env


def test_a_missing_key_is_said_at_start_and_ends_its_requests_without_a_call(db_url: str, tmp_path: Path) -> None:
    env = keyless_env(db_url, RETRY_INITIAL_DELAY=0.01)
    enqueue(env, write_requests(tmp_path / "in.jsonl", [("a", f"d{i}", f"q {i}") for i in range(3)]))
    enqueue(env, write_requests(tmp_path / "mock.jsonl", [("a", "m", "to the mock")]), "--provider", "mock")
    log = tmp_path / "daemon.log"
    assert run_daemon(env, log) == 0, log.read_text()
    said = [e for e in events(log) if e.get("level") == "ERROR" and e.get("provider") == "openai"]
    assert len(said) == 1 and "OPENAI_API_KEY is not set" in said[0]["error"], said
    store = Store(db_url)
    try:
        rows = {r["id"]: store.get_request(r["id"]) for r in store.list_requests()}
    finally:
        store.close()
    openai_rows = [r for r in rows.values() if r is not None and r["provider"] == "openai"]
    assert len(openai_rows) == 3
    for row in openai_rows:
        assert (row["status"], row["error_code"], row["attempts"]) == ("error", "config_error", 1)
        assert "OPENAI_API_KEY is not set" in row["error_message"]
    assert [r["status"] for r in rows.values() if r is not None and r["provider"] == "mock"] == ["completed"]


def test_a_server_other_than_the_provider_needs_no_key(db_url: str, tmp_path: Path) -> None:
    with mock_provider() as mock:
        env = keyless_env(db_url)
        env["OPENAI_BASE_URL"] = mock.openai_base_url
        enqueue(env, write_requests(tmp_path / "in.jsonl", [("a", "d", "hello")]))
        log = tmp_path / "daemon.log"
        assert run_daemon(env, log) == 0, log.read_text()
    store = Store(db_url)
    try:
        assert store.status_counts()["completed"] == 1
    finally:
        store.close()
    assert not [e for e in events(log) if e.get("level") == "ERROR"]


def test_a_missing_key_ends_batch_requests_without_an_upload(db_url: str, tmp_path: Path) -> None:
    env = keyless_env(db_url, LEDGER_PROVIDER_BATCH_WAIT=0, LEDGER_BATCH_POLL_INTERVAL=0.2)
    enqueue(
        env, write_requests(tmp_path / "in.jsonl", [("a", f"d{i}", f"q {i}") for i in range(3)]), "--delivery", "batch"
    )
    log = tmp_path / "daemon.log"
    assert run_daemon(env, log) == 0, log.read_text()
    said = [e for e in events(log) if e.get("level") == "ERROR" and e.get("provider") == "openai"]
    assert len(said) == 1 and "OPENAI_API_KEY is not set" in said[0]["error"], said
    store = Store(db_url)
    try:
        rows = [store.get_request(r["id"]) for r in store.list_requests()]
        assert store.list_batches() == []  # no batch opened, nothing uploaded
    finally:
        store.close()
    assert len(rows) == 3
    for row in rows:
        assert row is not None
        assert (row["status"], row["error_code"], row["attempts"]) == ("error", "config_error", 0)
        assert "OPENAI_API_KEY is not set" in row["error_message"]
