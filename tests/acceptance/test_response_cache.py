"""The response cache with real processes: twins across two daemons on PostgreSQL, enqueued by two
processes at once, and a daemon killed while a twin's original is in flight."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from sqlalchemy import text

from ledger.store import Store
from tests.acceptance.procs import LEDGER, events, ledger_env, mock_provider, run_daemon, start_daemon, wait_for


def questions(path: Path, prefix: str, n: int, marker: str = "") -> Path:
    """`n` different questions, under custom_ids of their own (`prefix`)."""
    with path.open("w") as f:
        for i in range(n):
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Question {i}. {marker}"}]}
            f.write(json.dumps({"custom_id": f"{prefix}-{i}", "body": body}) + "\n")
    return path


def cached_pairs(url: str) -> tuple[dict[str, int], int, int]:
    """Requests per status, how many were answered from the cache, and how many point at a copy."""
    store = Store(url)
    try:
        counts = store.status_counts()
        with store.engine.connect() as conn:
            hits = conn.execute(text("SELECT COUNT(*) FROM llm_requests WHERE cached_from IS NOT NULL")).scalar_one()
            chained = conn.execute(
                text(
                    "SELECT COUNT(*) FROM llm_requests r JOIN llm_requests s ON s.id = r.cached_from"
                    " WHERE s.cached_from IS NOT NULL"
                )
            ).scalar_one()
    finally:
        store.close()
    return counts, int(hits), int(chained)


def test_twins_across_two_daemons_and_two_enqueues_on_postgresql_make_one_call_each(
    pg_url: str, tmp_path: Path
) -> None:
    """Two processes enqueue the same ten questions at once beside two daemons; every call is held
    until both daemons have had every chance to claim a twin. One call per question."""
    with mock_provider() as mock:
        env = ledger_env(pg_url, mock, MAX_CONCURRENT_LLM_CALLS=40, LEDGER_POLL_INTERVAL=0.05)
        files = [questions(tmp_path / f"{p}.jsonl", p, 10, "[[mock:hold]]") for p in ("left", "right")]
        daemons = [start_daemon(env, tmp_path / f"d{i}.log", "--worker-id", f"daemon-{i}") for i in range(2)]
        enqueues = [
            subprocess.Popen([*LEDGER, "enqueue", str(f)], env=env, stdout=subprocess.PIPE, text=True) for f in files
        ]
        said = [p.communicate(timeout=60)[0] for p in enqueues]
        assert all(p.returncode == 0 for p in enqueues), said
        wait_for(lambda: mock.stats()["in_flight"] == 10)
        # Both daemons have claimed since the enqueues ended (their claims came back empty of twins).
        logs = [tmp_path / f"d{i}.log" for i in range(2)]
        wait_for(lambda: all("start" in {e["event"] for e in events(log)} for log in logs))
        mock.release()
        wait_for(lambda: cached_pairs(pg_url)[0].get("completed") == 20, timeout=60)
        stats = mock.stats()
        for daemon in daemons:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=30) == 0
    counts, hits, chained = cached_pairs(pg_url)
    assert stats["calls"] == 10 and stats["max_in_flight"] == 10
    assert counts["completed"] == sum(counts.values()) == 20 and hits == 10 and chained == 0
    assert sum(int(s.split("enqueued 10 request(s)")[1].startswith(", 10 waiting")) for s in said) == 1


def test_a_daemon_killed_while_a_twins_original_is_in_flight_costs_one_call_more(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider() as mock:
        env = ledger_env(db_url, mock, LEDGER_LEASE_SECONDS=2, LEDGER_POLL_INTERVAL=0.05)
        path = tmp_path / "same.jsonl"
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "One question [[mock:hold]]"}]}
        path.write_text("".join(json.dumps({"custom_id": f"same-{i}", "body": body}) + "\n" for i in range(5)))
        done = subprocess.run([*LEDGER, "enqueue", str(path)], env=env, capture_output=True, text=True, check=True)
        assert "4 waiting for an identical request in flight" in done.stdout
        victim = start_daemon(env, log)
        wait_for(lambda: mock.stats()["in_flight"] == 1)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        in_flight_at_kill = mock.stats()["calls"]
        mock.release()
        assert run_daemon(env, log, timeout=60) == 0
        calls = mock.stats()["calls"]
    counts, hits, chained = cached_pairs(db_url)
    assert in_flight_at_kill == 1 and calls == in_flight_at_kill + 1
    assert counts["completed"] == sum(counts.values()) == 5 and hits == 4 and chained == 0
    assert sum(1 for e in events(log) if e["event"] == "cache_hit") == 4
