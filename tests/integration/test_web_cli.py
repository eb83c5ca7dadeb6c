"""`ledger web` as a process: its first line, the port it took, the Host check, the token off
loopback (refused without one), live events when the ledger changes; and a SQLite URL whose
directory cannot exist, refused in one line."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
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
    # Stopped by SIGTERM (web_process): a stop asked for, so exit status 0, and nothing said.
    assert proc.returncode == 0 and proc.stderr is not None and proc.stderr.read() == ""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_with_a_page_listening_ends_its_stream_and_exits_0_quietly(db_url: str, stop: signal.Signals) -> None:
    """The open event stream is ended by the server, not cancelled when uvicorn's grace period
    runs out (which logged `timeout graceful shutdown exceeded` and a traceback per page, and
    exited by the signal: 143 or 130)."""
    Store(db_url).close()
    with web_process(db_url) as (proc, base), httpx.stream("GET", base + "/events", timeout=20) as events:
        lines = events.iter_lines()
        assert next(lines).startswith("retry:")  # the page is listening
        proc.send_signal(stop)
        rest = list(lines)  # the stream ends whole (cut off, httpx raises); its read timeout is the deadline
        assert not any(line.startswith("event:") for line in rest)
        assert proc.wait(timeout=20) == 0
    assert proc.stderr is not None and proc.stderr.read() == ""


def test_a_page_hears_of_a_change_over_server_sent_events(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    done = threading.Event()

    def keep_changing() -> None:
        """A request enqueued every half second until the page hears (the server's first reading
        after the page connects is its baseline: a change before it is not news)."""
        for i in range(100):
            if done.wait(0.5):
                return
            message = [{"role": "user", "content": "x"}]
            store.enqueue([to_row(build_spec(model="m", provider="mock", idempotency_key=f"e-{i}", messages=message))])

    changer = threading.Thread(target=keep_changing)
    with web_process(sqlite_url) as (_proc, base), httpx.stream("GET", base + "/events", timeout=20) as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        lines = events.iter_lines()
        assert next(lines).startswith("retry:")  # listening: the probe loop has a listener now
        changer.start()
        try:
            line = next(lines)
            while not line.startswith("event: change"):  # the stream's read timeout is the deadline
                line = next(lines)
            data = next(lines)
        finally:
            done.set()
            changer.join()
        assert data.startswith("data: ") and "requests" in json.loads(data[len("data: ") :])
    store.close()


def test_off_loopback_the_token_is_required(sqlite_url: str) -> None:
    Store(sqlite_url).close()
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
    # A command that creates the ledger says why it cannot; one that only reads finds none there.
    for command, said in (
        (["migrate"], "is a file, not a directory"),
        (["status"], "no ledger at"),
        (["web", "--port", "0"], "no ledger at"),
    ):
        result = subprocess.run([*LEDGER, *command], env=env_for(url), capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert said in result.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_loopback_needs_no_token(sqlite_url: str, host: str) -> None:
    Store(sqlite_url).close()
    with web_process(sqlite_url, "--host", host) as (_proc, base):
        assert httpx.get(base + "/jobs", timeout=10).status_code == 200
