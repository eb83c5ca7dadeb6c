"""The daemon as an operator runs it: real processes, real SDKs, the mock provider over HTTP."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.store import Store
from tests.acceptance.procs import (
    balanced,
    enqueue,
    events,
    ledger_env,
    max_slots_from_log,
    mock_provider,
    run_daemon,
    start_daemon,
    wait_for,
    write_requests,
)

AGENTS = ("prosecutor", "defense", "judge")


def seed_case(tmp_path: Path, extra: str = "") -> Path:
    prompts = [(a, f"dim-{d}", f"{a} evaluates dimension {d}. {extra}") for a in AGENTS for d in range(10)]
    return write_requests(tmp_path / "seed.jsonl", prompts)


def test_seed_case_30_requests_limit_5(db_url: str, tmp_path: Path) -> None:
    """The bounded-concurrency check: never more than 5 at once, 5 at some point, all 30 complete."""
    log = tmp_path / "daemon.log"
    with mock_provider("--latency", "0.2") as mock:
        env = ledger_env(db_url, mock, MAX_CONCURRENT_LLM_CALLS=5)
        enqueue(env, seed_case(tmp_path), "--job", "seed")
        assert run_daemon(env, log) == 0
        stats = mock.stats()
    assert stats["max_in_flight"] == 5
    assert stats["calls"] == 30
    store = Store(db_url)
    assert store.status_counts("seed")["completed"] == 30
    done = store.list_requests(job_id="seed")
    assert all(r["input_tokens"] and r["output_tokens"] for r in done)
    store.close()
    records = events(log)
    assert max_slots_from_log(records) == 5
    start = next(e for e in records if e["event"] == "start")
    assert start["max_concurrent_llm_calls"] == 5
    acquired = [e for e in records if e["event"] == "acquired"]
    assert len(acquired) == 30
    assert set(acquired[0]) == {"event", "agent", "dimension", "active_slots", "request_id", "ts"}
    assert {e["agent"] for e in acquired} == set(AGENTS)


def test_transient_faults_all_recover_within_the_attempt_budget(sqlite_url: str, tmp_path: Path) -> None:
    """429 storm with retry-after, 502/503/529 on first attempts, hangs past the timeout."""
    faults = {
        "rl": "[[mock:fail=429x2]] [[mock:retry_after=0.3]]",
        "bad-gateway": "[[mock:fail=502x1]]",
        "unavailable": "[[mock:fail=503x2]]",
        "overloaded": "[[mock:fail=529x1]]",
        "hang": "[[mock:hang=1]]",
    }
    prompts = [
        ("agent", f"{name}-{i}", f"{name} case {i} {directive}") for name, directive in faults.items() for i in range(4)
    ]
    prompts += [("agent", f"plain-{i}", f"plain {i}") for i in range(10)]
    log = tmp_path / "daemon.log"
    with mock_provider() as mock:
        env = ledger_env(
            sqlite_url,
            mock,
            MAX_CONCURRENT_LLM_CALLS=8,
            RETRY_MAX_ATTEMPTS=3,
            RETRY_INITIAL_DELAY=0.05,
            RETRY_MAX_DELAY=2,
            LLM_CALL_TIMEOUT=0.5,
            # The 429s teach the pool a limit of one; probing it back up within a second, not a
            # minute, lets the other faults run side by side (the run took 17 s one at a time).
            LEDGER_POOL_PROBE_SECONDS=0.5,
        )
        enqueue(env, write_requests(tmp_path / "faults.jsonl", prompts))
        assert run_daemon(env, log) == 0
        stats = mock.stats()
    store = Store(sqlite_url)
    assert store.status_counts()["completed"] == len(prompts)
    with store.engine.connect() as conn:
        attempts: dict[str, int] = dict(
            conn.execute(
                text(
                    "SELECT json_extract(r.trace, '$.dimension'), COUNT(a.id) FROM llm_requests r "
                    "JOIN llm_attempts a ON a.request_id = r.id GROUP BY r.id"
                )
            ).all()
        )
        unresolved_429 = conn.execute(
            text("SELECT COUNT(*) FROM llm_request_audit WHERE rate_limited_attempts > 0 AND status <> 'completed'")
        ).scalar_one()
        timeouts = conn.execute(text("SELECT COUNT(*) FROM llm_attempts WHERE outcome = 'timeout'")).scalar_one()
    store.close()
    assert all(attempts[f"rl-{i}"] == 3 for i in range(4))
    assert all(attempts[f"unavailable-{i}"] == 3 for i in range(4))
    assert all(attempts[f"bad-gateway-{i}"] == 2 and attempts[f"overloaded-{i}"] == 2 for i in range(4))
    assert all(attempts[f"hang-{i}"] == 2 for i in range(4)) and timeouts == 4
    assert all(attempts[f"plain-{i}"] == 1 for i in range(10))
    assert unresolved_429 == 0
    assert stats["status_counts"]["429"] == 8
    records = events(log)
    assert max_slots_from_log(records) <= 8
    retries = [e for e in records if e["event"] == "retry"]
    assert set(retries[0]) == {
        "event",
        "agent",
        "dimension",
        "attempt",
        "status_code",
        "delay_s",
        "request_id",
        "ts",
    }
    rl = [e for e in retries if e["dimension"].startswith("rl-")]
    assert rl and all(e["status_code"] == 429 and e["delay_s"] >= 0.3 for e in rl)
    assert len([e for e in records if e["event"] == "timeout"]) == 4


def test_persistent_failure_ends_in_error_and_the_rest_go_on(db_url: str, tmp_path: Path) -> None:
    prompts = [
        ("judge", "doomed", "always down [[mock:fail=503x*]]"),
        ("judge", "unauthorised", "bad key [[mock:fail=401x*]]"),
    ]
    prompts += [("judge", f"fine-{i}", f"fine {i}") for i in range(6)]
    log = tmp_path / "daemon.log"
    with mock_provider() as mock:
        env = ledger_env(db_url, mock, RETRY_MAX_ATTEMPTS=3, RETRY_INITIAL_DELAY=0.05)
        enqueue(env, write_requests(tmp_path / "p.jsonl", prompts))
        assert run_daemon(env, log) == 0
    store = Store(db_url)
    rows = {r["idempotency_key"]: r for r in store.export_rows()}
    by_dim = {r["trace"]["dimension"]: r for r in rows.values()}
    store.close()
    doomed, unauthorised = by_dim["doomed"], by_dim["unauthorised"]
    assert (doomed["status"], doomed["attempts"], doomed["last_status_code"]) == ("error", 3, 503)
    assert doomed["error_message"] and doomed["latency_ms"] is not None
    assert (unauthorised["status"], unauthorised["attempts"], unauthorised["last_status_code"]) == (
        "error",
        1,
        401,
    )
    assert all(by_dim[f"fine-{i}"]["status"] == "completed" for i in range(6))
    failed = [e for e in events(log) if e["event"] == "failed"]
    line = next(e for e in failed if e["dimension"] == "doomed")
    assert (line["level"], line["agent"], line["status_code"], line["attempts"]) == ("ERROR", "judge", 503, 3)
    assert line["elapsed_s"] > 0


def test_sigkill_mid_run_loses_nothing_and_repeats_at_most_what_was_in_flight(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider("--latency", "0.5") as mock:
        env = ledger_env(db_url, mock, MAX_CONCURRENT_LLM_CALLS=5, LEDGER_LEASE_SECONDS=1.5)
        enqueue(env, seed_case(tmp_path))
        victim = start_daemon(env, log)
        wait_for(lambda: mock.stats()["calls"] >= 12 and mock.stats()["in_flight"] == 5)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        in_flight_at_kill = 5
        assert run_daemon(env, log) == 0
        stats = mock.stats()
    store = Store(db_url)
    counts = store.status_counts()
    with store.engine.connect() as conn:
        succeeded = conn.execute(
            text("SELECT request_id, COUNT(*) FROM llm_attempts WHERE outcome = 'succeeded' GROUP BY request_id")
        ).all()
        lost = conn.execute(text("SELECT COUNT(*) FROM llm_attempts WHERE outcome = 'lost'")).scalar_one()
    store.close()
    assert counts["completed"] == 30 and counts["running"] == 0 and counts["queued"] == 0
    assert len(succeeded) == 30 and all(n == 1 for _, n in succeeded)
    assert 1 <= lost <= in_flight_at_kill
    repeats = sum(stats["per_prompt"].values()) - 30
    assert repeats <= in_flight_at_kill
    # The dead daemon's slots are released in the log by the daemon that reclaimed them.
    records = events(log)
    reclaimed = sum(e["count"] for e in records if e.get("message") == "reclaimed expired leases")
    assert reclaimed == in_flight_at_kill
    assert max_slots_from_log(records) == 5 and balanced(records)


def test_two_daemons_on_postgres_share_one_global_limit(pg_url: str, tmp_path: Path) -> None:
    prompts = [("a", f"d{i}", f"shared work {i}") for i in range(60)]
    logs = [tmp_path / "d1.log", tmp_path / "d2.log"]
    with mock_provider("--latency", "0.15") as mock:
        env = ledger_env(pg_url, mock, MAX_CONCURRENT_LLM_CALLS=4, LEDGER_POLL_INTERVAL=0.05)
        enqueue(env, write_requests(tmp_path / "w.jsonl", prompts))
        daemons = [start_daemon(env, log, "--until-idle", "--worker-id", f"daemon-{i}") for i, log in enumerate(logs)]
        assert [d.wait(timeout=120) for d in daemons] == [0, 0]
        stats = mock.stats()
    assert stats["max_in_flight"] <= 4 and stats["calls"] == 60
    store = Store(pg_url)
    with store.engine.connect() as conn:
        query = text("SELECT worker, COUNT(*) FROM llm_attempts GROUP BY worker")
        workers: dict[str, int] = dict(conn.execute(query).all())
    assert store.status_counts()["completed"] == 60
    store.close()
    assert set(workers) == {"daemon-0", "daemon-1"} and min(workers.values()) > 0
    assert max_slots_from_log(events(logs[0]) + events(logs[1])) <= 4


@pytest.mark.parametrize("grace", [10.0, 0.2])
def test_sigterm_finishes_or_releases_in_flight_work(sqlite_url: str, tmp_path: Path, grace: float) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider("--latency", "1.0") as mock:
        env = ledger_env(sqlite_url, mock, MAX_CONCURRENT_LLM_CALLS=5, LEDGER_SHUTDOWN_GRACE=grace)
        enqueue(env, seed_case(tmp_path))
        daemon = start_daemon(env, log)
        wait_for(lambda: mock.stats()["in_flight"] == 5)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 0
    store = Store(sqlite_url)
    counts = store.status_counts()
    with store.engine.connect() as conn:
        open_attempts = conn.execute(text("SELECT COUNT(*) FROM llm_attempts WHERE outcome = 'running'")).scalar_one()
        lost = conn.execute(text("SELECT COUNT(*) FROM llm_attempts WHERE outcome = 'lost'")).scalar_one()
    store.close()
    assert counts["running"] == 0 and open_attempts == 0
    assert counts["completed"] + counts["queued"] == 30
    if grace > 1.0:
        assert counts["completed"] == 5 and lost == 0  # in-flight calls were allowed to finish
    else:
        assert counts["completed"] == 0 and lost == 5  # cut off and given back to the queue
    records = events(log)
    assert max_slots_from_log(records) == 5
    assert balanced(records)


# A daemon that sends itself SIGTERM the moment it writes its start line: what a supervisor does
# that stops the daemon as soon as it reads that line.
_TERM_AT_START = """
import os, signal
from ledger import events
from ledger.cli import main

announce = events.started

def started(**limits):
    announce(**limits)
    os.kill(os.getpid(), signal.SIGTERM)

events.started = started
main()
"""


def test_a_sigterm_as_soon_as_the_start_line_is_written_stops_the_daemon_gracefully(
    sqlite_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    env = ledger_env(sqlite_url)
    with log.open("ab") as sink:
        daemon = subprocess.Popen([sys.executable, "-c", _TERM_AT_START, "daemon"], env=env, stdout=sink, stderr=sink)
    try:
        assert daemon.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        daemon.kill()  # (gone already, unless it hung)
    assert next(e["event"] for e in events(log)) == "start"
    assert "daemon stopped:" in log.read_text()  # its own summary: the stop ran its course


def test_no_api_key_reaches_the_database_or_the_logs(sqlite_url: str, tmp_path: Path) -> None:
    secret = "sk-test-DO-NOT-LEAK-4242"
    log = tmp_path / "daemon.log"
    prompts = [
        ("a", "ok", "fine"),
        ("a", "denied", "nope [[mock:fail=401x*]]"),
        ("a", "flaky", "x [[mock:fail=503x1]]"),
    ]
    with mock_provider() as mock:
        env = ledger_env(sqlite_url, mock, OPENAI_API_KEY=secret, RETRY_INITIAL_DELAY=0.05, LEDGER_LOG_LEVEL="DEBUG")
        enqueue(env, write_requests(tmp_path / "k.jsonl", prompts))
        assert run_daemon(env, log) == 0
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    store = Store(sqlite_url)
    assert store.status_counts()["completed"] == 2
    store.close()
    for path in [log, database, *database.parent.glob("ledger.db-*")]:
        assert secret.encode() not in path.read_bytes(), path


@pytest.mark.timing  # how many 429s a limit is learned in: run alone (see the test command)
def test_a_pool_configured_above_what_the_provider_serves_learns_its_limit(sqlite_url: str, tmp_path: Path) -> None:
    """Limit 8 against a provider that serves 3: one storm of 429s, then no more hammering."""
    log = tmp_path / "daemon.log"
    prompts = [("a", f"d{i}", f"capacity probe {i}") for i in range(30)]
    with mock_provider("--latency", "0.2", "--max-concurrency", "3") as mock:
        env = ledger_env(sqlite_url, mock, MAX_CONCURRENT_LLM_CALLS=8, RETRY_MAX_ATTEMPTS=5, RETRY_INITIAL_DELAY=0.05)
        enqueue(env, write_requests(tmp_path / "cap.jsonl", prompts))
        assert run_daemon(env, log) == 0
        stats = mock.stats()
    store = Store(sqlite_url)
    counts = store.status_counts()
    learned = store.pool_usage()["openai:gpt-4o-mini"]["learned_limit"]
    store.close()
    assert counts["completed"] == 30 and counts["error"] == 0
    assert stats["status_counts"]["429"] <= 8 - 3  # the first storm only
    assert learned == 3
    assert max_slots_from_log(events(log)) <= 8
