"""The pipeline example from a fresh checkout: it runs end to end, and killed with SIGKILL (the script
and the daemon) in the middle of its second stage and run again, it completes with no request
called twice beyond the calls in flight at the kill (the mock provider counts every call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from ledger.store import Store
from tests.acceptance.procs import ledger_env, mock_provider, start_daemon, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline" / "run.py"
STAGES = ("evidence", "rubric", "critic", "score")


def count(store: Store, sql: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def test_the_example_runs_keyless_in_one_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "OPENAI_", "ANTHROPIC_"))}
    done = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["claim", "score", "request", "parse", "error"]
    assert [line.split()[0] for line in lines[1:5]] == ["c1", "c2", "c3", "c4"]
    assert all(line.split()[1] in "12345" for line in lines[1:5])  # parsed VERDICTs
    assert any(line.startswith("lineage of request") for line in lines)
    assert any("<- request" in line and "evidence" in line for line in lines)  # walked back to its evidence
    assert (tmp_path / "pipeline.db").exists()


def test_killed_mid_second_stage_and_run_again_it_completes_without_paying_twice(db_url: str, tmp_path: Path) -> None:
    with mock_provider("--latency", "0.3") as mock:
        env = ledger_env(db_url, mock, MAX_CONCURRENT_LLM_CALLS=2, LEDGER_LEASE_SECONDS=3)
        daemon = start_daemon(env, tmp_path / "daemon.log")
        script = subprocess.Popen([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, stdout=subprocess.PIPE)
        store = Store(db_url)
        try:
            # In the middle of the second stage: some rubrics answered, not all of them.
            wait_for(
                lambda: (
                    count(store, "SELECT COUNT(*) FROM llm_requests WHERE purpose = 'rubric' AND status = 'completed'")
                    >= 1
                ),
                timeout=60,
            )
        finally:
            for proc in (script, daemon):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        in_flight = count(store, "SELECT COUNT(*) FROM llm_requests WHERE status = 'running'")
        rubrics_done = count(
            store, "SELECT COUNT(*) FROM llm_requests WHERE purpose = 'rubric' AND status = 'completed'"
        )
        assert 1 <= rubrics_done < 4, "the kill came in the middle of the second stage"
        assert count(store, "SELECT COUNT(*) FROM llm_requests WHERE purpose IN ('critic', 'score')") == 0

        # Run again, the same command: with no daemon alive, the script works in-process.
        again = subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "lineage of request" in again.stdout

        stats = mock.stats()
        requests = count(store, "SELECT COUNT(*) FROM llm_requests")
        assert requests == 16
        assert count(store, "SELECT COUNT(*) FROM llm_requests WHERE status = 'completed'") == 16
        assert count(store, "SELECT COUNT(*) FROM llm_requests WHERE parsed_verdict IS NOT NULL") == 4
        # Every request was called once, except those in flight at the kill: once more at most.
        assert requests <= stats["calls"] <= requests + in_flight
        assert max(stats["per_prompt"].values()) <= 2
        store.close()
