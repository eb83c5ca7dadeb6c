"""`ledger pools set` with two daemons running: the new limit holds across both from their next
claim (never exceeded after it), no restart needed, and it outlives a restart until `reset`.
Real processes, the real OpenAI SDK against the mock provider, on both databases."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from ledger.store import Store
from tests.acceptance.procs import (
    LEDGER,
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

POOL = "openai:gpt-4o-mini"
ENV = {"MAX_CONCURRENT_LLM_CALLS": 10, "LEDGER_POLL_INTERVAL": 0.1, "LEDGER_POOL_SLOW_START": "false"}


def ledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEDGER, *args], env=env, capture_output=True, text=True, timeout=60)


def held_after(records: list[dict[str, Any]], since: float) -> list[int]:
    """Replaying `acquired` / `released` of every daemon in time order: the slots held right after
    each acquisition made after `since`."""
    held, seen = 0, []
    for e in sorted((e for e in records if e["event"] in ("acquired", "released")), key=lambda e: e["ts"]):
        held += 1 if e["event"] == "acquired" else -1
        if e["event"] == "acquired" and e["ts"] > since:
            seen.append(held)
    return seen


def pool_row(env: dict[str, str]) -> dict[str, Any]:
    done = ledger(env, "pools", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = [p for p in json.loads(done.stdout) if p["pool"] == POOL]
    return dict(row)


def test_a_limit_set_live_holds_across_two_daemons_at_their_next_claim_and_outlives_a_restart(
    db_url: str, tmp_path: Path
) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with mock_provider("--latency", "0.25") as mock:
        env = ledger_env(db_url, mock, **ENV)
        path = write_requests(tmp_path / "r.jsonl", [("a", f"d{i}", f"r {i}") for i in range(240)])
        enqueue(env, path)
        store = Store(db_url)
        daemons = [start_daemon(env, log, "--until-idle", "--worker-id", f"w{i}") for i, log in enumerate(logs)]
        wait_for(lambda: store.status_counts()["running"] >= 6, timeout=60)  # both daemons busy
        done = ledger(env, "pools", "set", POOL, "--limit", "4")
        set_at = time.time()
        assert done.returncode == 0 and "every daemon applies it at its next claim" in done.stdout
        assert [d.wait(timeout=120) for d in daemons] == [0, 0]
        assert store.status_counts()["completed"] == 240
        records = [e for log in logs for e in events(log)]
        before = held_after(records, 0)
        after = held_after(records, set_at + 0.5)  # a claim begun before the change may commit after it
        assert max(before) > 4  # the daemons ran wider before the change
        assert after and max(after) <= 4  # never more than the new limit, across both daemons
        assert pool_row(env)["limit"] == 4 and pool_row(env)["set_live"] == {"concurrency": 4}

        # A restart reads it from the ledger: no setting says 4.
        more = write_requests(tmp_path / "more.jsonl", [("a", f"d{i}", f"more {i}") for i in range(40)])
        enqueue(env, more)
        restarted = tmp_path / "c.log"
        assert run_daemon(env, restarted, "--worker-id", "w0", timeout=120) == 0
        assert max_slots_from_log(events(restarted)) == 4

        reset = ledger(env, "pools", "reset", POOL)
        assert reset.returncode == 0 and "back to its settings" in reset.stdout
        assert store.pool_overrides() == {}
        listed = [p for p in json.loads(ledger(env, "pools", "--json").stdout) if p["pool"] == POOL]
        assert all(p["limit"] == 10 and p["set_live"] == {} for p in listed)  # listed while it has work
    store.close()


def test_a_pool_that_is_not_a_pool_key_or_a_limit_outside_1_to_50_is_refused_in_one_line(db_url: str) -> None:
    env = ledger_env(db_url)
    for args, said in [
        (["gpt-4o", "--limit", "3"], "pool 'gpt-4o' is not a pool key"),
        ([POOL, "--limit", "0"], "--limit must be from 1 to 50, got 0"),
        ([POOL, "--limit", "51"], "--limit must be from 1 to 50, got 51"),
        ([POOL], "give --limit, --rpm or --tpm"),
    ]:
        done = ledger(env, "pools", "set", *args)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert all(p["pool"] != "id:gpt-4o" for p in json.loads(ledger(env, "pools", "--json").stdout))
