"""PostgreSQL itself stopped under a running daemon, then started again.

Each test runs its own throwaway server (`ledger.embedded_postgres`), so stopping it
touches nothing else. Shorter than LEDGER_DB_RETRY_SECONDS, the daemon carries on;
longer, it exits 1 with one line and a rerun finishes the work. Either way nothing
is lost and no request is answered twice beyond the calls in flight at the outage.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.embedded_postgres import EmbeddedPostgres
from ledger.store import Store
from tests.acceptance.procs import (
    counts_and_most_successes,
    enqueue,
    ledger_env,
    mock_provider,
    run_daemon,
    start_daemon,
    wait_for,
    write_requests,
)

REQUESTS = 60


@pytest.fixture
def server() -> Iterator[EmbeddedPostgres]:
    own = EmbeddedPostgres()
    own.start()
    yield own
    own.stop()


def url_of(server: EmbeddedPostgres) -> str:
    return server.dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def test_an_outage_shorter_than_the_retry_window_is_ridden_out(server: EmbeddedPostgres, tmp_path: Path) -> None:
    url, log = url_of(server), tmp_path / "daemon.log"
    prompts = [("a", f"d{i}", f"short outage {i}") for i in range(REQUESTS)]
    with mock_provider("--latency", "0.2") as mock:
        env = ledger_env(url, mock, MAX_CONCURRENT_LLM_CALLS=5, LEDGER_DB_RETRY_SECONDS=60, LEDGER_LEASE_SECONDS=30)
        enqueue(env, write_requests(tmp_path / "s.jsonl", prompts))
        daemon = start_daemon(env, log, "--until-idle")
        wait_for(lambda: mock.stats()["calls"] >= 10)
        server.halt()
        in_flight = mock.stats()["in_flight"]
        wait_for(lambda: "database unavailable, trying again" in log.read_text(), timeout=60)
        server.resume()
        assert daemon.wait(timeout=120) == 0, log.read_text()[-3000:]
        per_prompt = mock.stats()["per_prompt"]
    counts, most_successes = counts_and_most_successes(url)
    assert counts["completed"] == REQUESTS and counts["queued"] == counts["running"] == 0
    assert most_successes == 1  # nothing recorded twice
    assert sum(n - 1 for n in per_prompt.values()) <= in_flight  # called again: only what was in flight


def test_an_outage_longer_than_the_retry_window_stops_the_daemon_and_a_rerun_finishes(
    server: EmbeddedPostgres, tmp_path: Path
) -> None:
    url = url_of(server)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    prompts = [("a", f"d{i}", f"long outage {i}") for i in range(REQUESTS)]
    with mock_provider("--latency", "0.2") as mock:
        env = ledger_env(url, mock, MAX_CONCURRENT_LLM_CALLS=5, LEDGER_DB_RETRY_SECONDS=2, LEDGER_LEASE_SECONDS=3)
        enqueue(env, write_requests(tmp_path / "l.jsonl", prompts))
        daemon = start_daemon(env, first_log, "--until-idle", "--worker-id", "first")
        wait_for(lambda: mock.stats()["calls"] >= 10)
        server.halt()
        assert daemon.wait(timeout=120) == 1
        last = first_log.read_text().strip().splitlines()[-1]
        assert last.startswith("database failed, daemon stopped:"), first_log.read_text()[-2000:]
        server.resume()
        assert run_daemon(env, second_log, "--until-idle") == 0, second_log.read_text()[-3000:]
        per_prompt = mock.stats()["per_prompt"]
    counts, most_successes = counts_and_most_successes(url)
    assert counts["completed"] == REQUESTS and counts["queued"] == counts["running"] == 0
    assert most_successes == 1
    # Called again: only the calls the first daemon had in flight when the database went away, its
    # attempts that ended `lost` (claimed, never recorded). Counted from the ledger, not from the
    # mock's calls in flight read just after the halt, which misses a call the daemon was about to
    # send (a CI failure in a slow phase: 5 calls again against 3 read in flight).
    store = Store(url)
    with store.engine.connect() as conn:
        lost = conn.execute(
            text("SELECT COUNT(*) FROM llm_attempts WHERE worker = 'first' AND outcome = 'lost'")
        ).scalar_one()
    store.close()
    assert sum(n - 1 for n in per_prompt.values()) <= lost <= 5  # 5: MAX_CONCURRENT_LLM_CALLS
