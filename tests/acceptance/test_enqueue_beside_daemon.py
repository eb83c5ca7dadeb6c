"""A 300,000-line enqueue beside a busy daemon on SQLite cuts no call.

SQLite has one write lock per file. An enqueue that held it for the whole file made a
running daemon's claims and records wait that long, past its busy timeout: calls
ended in database-lock errors or lost leases. The enqueue now writes in short
chunks with a pause after each (`Dialect.enqueue_pacing`): the daemon keeps
completing calls the whole time, and every call it makes succeeds.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.store import Store
from tests.acceptance.procs import (
    LEDGER,
    enqueue,
    events,
    ledger_env,
    mock_provider,
    start_daemon,
    wait_for,
    write_requests,
)

# Rates and windows that real processes keep: run alone, after the parallel part (the test command).
pytestmark = pytest.mark.timing

LINES = 300_000
# Far below SQLite's busy timeout (30 s) and the lease (30 s): the longest the daemon may go
# without completing a call while the enqueue runs. Holding the lock for the whole file took
# far longer than this.
MAX_GAP_S = 5.0
BUSY = 4000  # 200 s of calls: the daemon is never out of work while the enqueue runs


def write_bulk(path: Path) -> Path:
    """300,000 OpenAI Batch lines, written fast (a template, not json.dumps per line)."""
    template = (
        '{{"custom_id":"bulk-{0}","body":{{"model":"gpt-4o-mini","max_tokens":16,'
        '"messages":[{{"role":"user","content":"question {0}"}}]}}}}\n'
    )
    with path.open("w") as f:
        f.writelines(template.format(i) for i in range(LINES))
    return path


def completed(url: str) -> int:
    store = Store(url)
    try:
        return int(store.status_counts().get("completed", 0))
    finally:
        store.close()


def test_a_300k_line_enqueue_beside_a_busy_daemon_cuts_no_call(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # Busy for longer than the enqueue takes (4 slots x 0.2 s: 20 calls a second; the enqueue validates
    # and stages the whole file before it writes, up to a minute on a slow machine): a daemon out of
    # work before the first chunk is written would be idle, not held back, and "completed nothing"
    # would measure the staging. 500 calls (25 s) ran out on this machine in its slow phases.
    busy = write_requests(tmp_path / "busy.jsonl", [("agent", f"d{i}", f"busy {i}") for i in range(BUSY)])
    bulk = write_bulk(tmp_path / "bulk.jsonl")
    log = tmp_path / "daemon.log"
    with mock_provider("--latency", "0.2") as mock:
        env = ledger_env(url, mock, MAX_CONCURRENT_LLM_CALLS=4)
        enqueue(env, busy, "--job", "busy")
        daemon = start_daemon(env, log)
        try:
            wait_for(lambda: completed(url) >= 20, timeout=60)  # the daemon is busy
            started = time.time()
            # Priority below the busy job's: the daemon works on those first, then on these.
            done = subprocess.run(
                [*LEDGER, "enqueue", str(bulk), "--job", "bulk", "--priority=-1"],
                env={**env, "LEDGER_LOG_LEVEL": "WARNING"},
                capture_output=True,
                text=True,
                timeout=300,
            )
            ended = time.time()
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"enqueued {LINES} request(s)" in done.stdout

    released = [e for e in events(log) if e["event"] == "released"]
    busy_done = sum(1 for e in released if e.get("dimension", "").startswith("d") and e["ts"] < ended)
    assert busy_done < BUSY, "the busy job ran out before the enqueue ended: the daemon was idle, not held back"
    releases = sorted(e["ts"] for e in released)
    during = [started, *(ts for ts in releases if started < ts < ended), ended]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert len(during) > 2, "no call completed while the enqueue ran"
    assert max(gaps) < MAX_GAP_S, f"the daemon completed nothing for {max(gaps):.1f} s during the enqueue"
    print(f"enqueue of {LINES} lines beside the daemon: {ended - started:.1f} s, {len(during) - 2} calls completed")
    print(f"meanwhile, longest time without a completed call: {max(gaps):.2f} s")

    log_text = log.read_text()
    assert "locked" not in log_text and "Traceback" not in log_text, log_text[-3000:]
    store = Store(url)
    with store.engine.connect() as conn:
        by_outcome = conn.execute(text("SELECT outcome, count(*) FROM llm_attempts GROUP BY outcome")).all()
        outcomes = {str(outcome): int(count) for outcome, count in by_outcome}
        bulk_rows = conn.execute(text("SELECT count(*) FROM llm_requests WHERE job_id = 'bulk'")).scalar_one()
    counts = store.status_counts()
    store.close()
    assert set(outcomes) == {"succeeded"}, outcomes  # no call failed, timed out or was lost
    assert counts["error"] == 0, counts
    assert bulk_rows == LINES
