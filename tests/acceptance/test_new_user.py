"""What a new user meets at the command line: the demo's hints, standard input, help, one-line
refusals, `show`'s figures and the enqueue's log lines. Each through the real `ledger` command."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from ledger.store import Store
from tests.acceptance.procs import LEDGER, events, ledger_env, mock_provider, run_daemon

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
    "web",
    "mock-provider",
    "demo",
    "eval",
    "report",
    "reparse",
    "pools resume",
]


def ledger(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LEDGER, *args],
        env={**(env if env is not None else os.environ), "COLUMNS": "200"},
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def line(model: str = "gpt-4o-mini", text: str = "hello", **extra: object) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}], **extra}) + "\n"


def test_the_demo_suggests_commands_that_read_its_ledger(tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    demo = ledger("demo", "--latency", "0.02", cwd=tmp_path / "here")
    assert demo.returncode == 0, demo.stderr
    suggested = [x.strip() for x in demo.stdout.splitlines() if x.strip().startswith("LEDGER_DATABASE_URL=")]
    assert [s.split(" ", 1)[1] for s in suggested] == ["ledger report example-eval", "ledger requests", "ledger show 1"]
    said = {}
    for command in suggested:  # as a user pastes it, from another directory
        setting, *argv = shlex.split(command)
        name, _, value = setting.partition("=")
        result = ledger(*argv[1:], env={**os.environ, name: value}, cwd=tmp_path / "elsewhere")
        assert result.returncode == 0, (command, result.stderr)
        said[argv[1]] = result.stdout
    assert "example-eval: completed" in said["report"]
    assert said["requests"].count("completed") == 30
    assert "succeeded" in said["show"]
    assert list((tmp_path / "elsewhere").iterdir()) == []  # no ./ledger.db made on the way


def test_enqueue_reads_standard_input(db_url: str) -> None:
    env = ledger_env(db_url)
    result = ledger("enqueue", "-", "--provider", "mock", env=env, stdin=line(text="one") + line(text="two"))
    assert result.returncode == 0, result.stderr
    assert "enqueued 2 request(s)" in result.stdout
    bad = ledger("enqueue", "-", "--provider", "mock", env=env, stdin=line(text="three") + '{"model": "m"}\n')
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: <stdin>:2: missing 'messages'"
    store = Store(db_url)
    try:
        assert store.status_counts()["queued"] == 2  # nothing of the bad input
    finally:
        store.close()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_flags_as_flags_and_every_option_explained(command: str) -> None:
    result = ledger(*command.split(), "--help")
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout
    options = result.stdout.split("Options:", 1)[1]
    entries = re.split(r"\n(?=  -)", options.strip("\n"))
    for entry in entries:
        words = entry.split()
        value = 1 if len(words) > 1 and (words[1].startswith("<") or words[1].isupper() or "=" in words[1]) else 0
        if words[1 + value : 1 + value + 1] == ["range>"]:
            value += 1
        assert len(words) - 1 - value >= 2, f"{command}: {entry!r} has no help"
    if "--json" in options:
        assert re.search(r"^  --json {2,}\S", options, re.MULTILINE), options


def test_mock_provider_help_is_whole() -> None:
    result = ledger("mock-provider", "--help")
    description = result.stdout.split("Options:")[0].split("\n\n", 1)[1]
    assert description.strip().endswith("."), description
    for option in ("--host", "--port", "--latency", "--jitter", "--max-concurrency", "--fault-rate", "--seed"):
        assert f"  {option} " in result.stdout


def test_openai_compatible_without_its_url_is_refused_at_enqueue(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "local.jsonl"
    path.write_text(line(text="fine", model="llama3") + line(text="also", model="llama3"))
    result = ledger("enqueue", str(path), "--provider", "openai-compatible", env=ledger_env(db_url))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: {path}:1: provider 'openai-compatible' needs OPENAI_COMPATIBLE_BASE_URL, which is not set"
    )
    store = Store(db_url)
    try:
        assert sum(store.status_counts().values()) == 0
    finally:
        store.close()


def test_show_rounds_the_retry_wait_and_events_name_a_plain_request_by_its_custom_id(
    db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        line(text="[[mock:fail=503x1]] plain")
        + line(text="judged", metadata={"agent": "judge", "dimension": "clarity"})
    )
    with mock_provider() as mock:
        env = ledger_env(db_url, mock, RETRY_INITIAL_DELAY=0.01, LEDGER_LOG_LEVEL="INFO")
        queued = ledger("enqueue", str(path), env=env)
        assert queued.returncode == 0, queued.stderr
        log = tmp_path / "daemon.log"
        assert run_daemon(env, log) == 0, log.read_text()
    store = Store(db_url)
    try:
        plain = store.get_request(1)
        assert plain is not None and plain["attempts"] == 2  # the 503, then the answer
        plain_key = plain["idempotency_key"]
    finally:
        store.close()
    queueing = [json.loads(x) for x in queued.stderr.splitlines() if x.startswith("{")]
    assert [{k: v for k, v in e.items() if k not in ("ts", "queue_depth")} for e in queueing] == [
        {"event": "queueing", "custom_id": plain_key, "request_id": 1},
        {"event": "queueing", "agent": "judge", "dimension": "clarity", "request_id": 2},
    ]
    for event in events(log):
        if event.get("request_id") == 1 and event["event"] in ("acquired", "released", "retry"):
            assert event["custom_id"] == plain_key and "agent" not in event and "dimension" not in event
    shown = ledger("show", "1", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "retry in" in shown.stdout and "retry in s" not in shown.stdout
    waits = re.findall(r"│ (\d+\.\d+)(?: s)? *│ \d{4}-", shown.stdout)
    assert waits and all(re.fullmatch(r"\d+\.\d", w) for w in waits), shown.stdout
    assert re.search(r"│ \d+\.\d s *│", shown.stdout)
