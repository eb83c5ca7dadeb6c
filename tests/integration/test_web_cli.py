"""`ledger web` as a process: its first line, the port it took, the Host check, the token off
loopback (refused without one), live events when the ledger changes; and a SQLite URL whose
directory cannot exist, refused in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from ledger.enqueue import build_spec, to_row
from ledger.store import Store
from tests.integration.web_helpers import LEDGER, env_for, web_process


def test_the_first_line_names_the_port_taken_and_the_page_answers(db_url: str) -> None:
    Store(db_url).close()
    with web_process(db_url) as (proc, base):
        page = httpx.get(base + "/", timeout=10)
        assert page.status_code == 200 and "Requests by status" in page.text
        assert httpx.get(base + "/", headers={"host": "rebound.example"}, timeout=10).status_code == 421
        assert httpx.get(base + "/", headers={"host": "localhost:1"}, timeout=10).status_code == 200
    # Stopped by SIGTERM: uvicorn shuts down, then ends by that signal (as a stopped server should).
    assert proc.returncode in (0, -15) and proc.stderr is not None and "Traceback" not in proc.stderr.read()


def test_a_page_hears_of_a_change_over_server_sent_events(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    with web_process(sqlite_url) as (_proc, base), httpx.stream("GET", base + "/events", timeout=20) as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        lines = events.iter_lines()
        assert next(lines).startswith("retry:")  # listening: the probe loop has a listener now
        spec = build_spec(
            model="m", provider="mock", idempotency_key="e-1", messages=[{"role": "user", "content": "x"}]
        )
        seen: list[str] = []
        for line in lines:  # the stream's own read timeout is the deadline
            seen.append(line)
            if line.startswith("event: change"):
                break
            if len(seen) == 3:  # the listening comment read: now change the ledger
                store.enqueue([to_row(spec)])
        data = next(lines)
        assert data.startswith("data: ") and "requests" in data
    store.close()


def test_off_loopback_the_token_is_required(sqlite_url: str) -> None:
    refused = subprocess.run(
        [*LEDGER, "web", "--host", "0.0.0.0", "--port", "0"],
        env=env_for(sqlite_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.strip().splitlines()) == 1 and "LEDGER_WEB_TOKEN" in refused.stderr
    with web_process(sqlite_url, "--host", "0.0.0.0", LEDGER_WEB_TOKEN="t0ken") as (_proc, base):
        assert httpx.get(base + "/", timeout=10).status_code == 401
        assert httpx.get(base + "/", headers={"Authorization": "Bearer t0ken"}, timeout=10).status_code == 200


def test_a_sqlite_path_through_a_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    url = f"sqlite:///{tmp_path / 'a-file' / 'deeper' / 'ledger.db'}"
    for command in (["status"], ["web", "--port", "0"]):
        result = subprocess.run([*LEDGER, *command], env=env_for(url), capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert "is a file, not a directory" in result.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_needs_no_token(sqlite_url: str, host: str) -> None:
    with web_process(sqlite_url, "--host", host) as (_proc, base):
        assert httpx.get(base + "/jobs", timeout=10).status_code == 200
