"""Provider batch jobs with real processes: kills in the create window and mid-mapping, two daemons,
cancel, and the `batches` / `show` views. The real SDKs talk to the mock provider over HTTP."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from ledger.store import Store
from tests.acceptance.procs import (
    LEDGER,
    enqueue,
    events,
    ledger_env,
    mock_provider,
    run_daemon,
    start_daemon,
    wait_for,
    write_requests,
)
from tests.integration.batch_helpers import attempts_t, batches_t, requests_t, rows

BATCH_ENV = {"LEDGER_PROVIDER_BATCH_WAIT": 0, "LEDGER_BATCH_POLL_INTERVAL": 0.1, "LEDGER_POLL_INTERVAL": 0.1}
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}


def enqueue_batch(env: dict[str, str], tmp_path: Path, n: int, provider: str, name: str = "b") -> None:
    prompts = [("a", f"d{i}", f"{name} request {i}") for i in range(n)]
    path = write_requests(tmp_path / f"{name}.jsonl", prompts, model=MODELS[provider])
    enqueue(env, path, "--delivery", "batch", "--provider", provider)


def one_succeeded_attempt_each(store: Store) -> bool:
    outcomes = Counter((a["request_id"], a["outcome"]) for a in rows(store, attempts_t))
    return all(outcomes[(r["id"], "succeeded")] == 1 for r in rows(store, requests_t)) and not any(
        outcome == "running" for _, outcome in outcomes
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_a_kill_inside_the_create_window_is_adopted_never_submitted_twice(
    db_url: str, tmp_path: Path, provider: str
) -> None:
    log = tmp_path / "daemon.log"
    # The provider registers the batch, then holds the create call's answer for 60 s.
    with mock_provider("--batch-create-stall", "60", "--batch-latency", "0.3") as mock:
        env = ledger_env(db_url, mock, **BATCH_ENV)
        enqueue_batch(env, tmp_path, 20, provider)
        daemon = start_daemon(env, log, "--worker-id", "batcher")
        wait_for(lambda: mock.stats()["batch_creates"].get(provider) == 1)  # accepted at the provider
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        store = Store(db_url)
        (before,) = rows(store, batches_t)
        assert (before["status"], before["provider_batch_id"]) == ("submitting", None)  # never recorded

        assert run_daemon(env, log, "--worker-id", "batcher", timeout=60) == 0
        stats = mock.stats()
    assert stats["batch_creates"] == {provider: 1}  # the provider saw exactly one create
    (after,) = rows(store, batches_t)
    assert after["status"] == "completed" and after["adopted_at"] is not None
    assert [after["provider_batch_id"]] == stats["batch_ids"]
    assert all(r["status"] == "completed" and r["batch_id"] == after["id"] for r in rows(store, requests_t))
    assert one_succeeded_attempt_each(store)
    assert any(e["event"] == "batch_adopted" for e in events(log))
    store.close()


def test_a_kill_mid_mapping_is_finished_by_the_restart_with_one_succeeded_attempt_each(
    db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    # The first download of the output file pauses half-way: some chunks mapped, the rest not yet.
    with mock_provider("--batch-results-stall", "60", "--batch-latency", "0.2") as mock:
        env = ledger_env(db_url, mock, **BATCH_ENV, LEDGER_PROVIDER_BATCH_SIZE=6000)
        enqueue_batch(env, tmp_path, 6000, "openai")
        daemon = start_daemon(env, log, "--worker-id", "mapper")
        store = Store(db_url)
        wait_for(lambda: 0 < store.status_counts()["completed"] < 6000, timeout=60)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
        partly = store.status_counts()["completed"]
        assert run_daemon(env, log, "--worker-id", "mapper", timeout=120) == 0
        assert mock.stats()["batch_creates"] == {"openai": 1}
    assert 0 < partly < 6000
    assert store.status_counts()["completed"] == 6000
    assert one_succeeded_attempt_each(store)
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(attempts_t)).scalar_one() == 6000  # no duplicate rows
    store.close()


def test_two_daemons_never_submit_or_poll_the_same_batch_at_once(pg_url: str, tmp_path: Path) -> None:
    logs = [tmp_path / "d1.log", tmp_path / "d2.log"]
    with mock_provider("--batch-latency", "1.5") as mock:
        env = ledger_env(pg_url, mock, **BATCH_ENV, LEDGER_PROVIDER_BATCH_SIZE=50)
        for provider in ("openai", "anthropic"):
            enqueue_batch(env, tmp_path, 200, provider, name=provider)
        daemons = [start_daemon(env, log, "--until-idle") for log in logs]
        assert all(d.wait(timeout=120) == 0 for d in daemons)
        creates = mock.stats()["batch_creates"]
    store = Store(pg_url)
    batches = rows(store, batches_t)
    assert len(batches) == 8 and sum(creates.values()) == 8  # each ledger batch created once
    assert len({b["provider_batch_id"] for b in batches}) == 8
    assert all(r["status"] == "completed" for r in rows(store, requests_t))
    assert one_succeeded_attempt_each(store)
    records = [(e, log.name) for log in logs for e in events(log)]
    steps: dict[int, list[tuple[float, float, str]]] = {}
    for e, name in records:
        if e["event"] in ("batch_polled", "batch_submitted"):
            steps.setdefault(e["batch_id"], []).append((e["step_started"], e["ts"], name))
    assert {name for _, name in records if _["event"] == "batch_polled"} == {"d1.log", "d2.log"}  # both worked
    for spans in steps.values():  # one daemon at a time per batch: the steps never overlap
        spans.sort()
        assert all(a_end <= b_start for (_, a_end, _n), (b_start, _, _m) in itertools.pairwise(spans))
    store.close()


# What each provider calls a batch that is being canceled, and one that was.
CANCELING = {
    "openai": ("cancell(ing|ed)", "cancelled"),
    "gemini": ("JOB_STATE_(RUNNING|CANCELLED)", "JOB_STATE_CANCELLED"),
}


@pytest.mark.parametrize("provider", sorted(CANCELING))
def test_cancel_a_batch_keeps_what_finished_and_cancels_the_rest(
    sqlite_url: str, tmp_path: Path, provider: str
) -> None:
    log = tmp_path / "daemon.log"
    canceling, canceled = CANCELING[provider]
    # A batch long in progress (the cancel must find it running, however slowly the daemon starts).
    with mock_provider("--batch-latency", "20", "--batch-finalize-seconds", "0.5") as mock:
        env = ledger_env(sqlite_url, mock, **BATCH_ENV)
        enqueue_batch(env, tmp_path, 40, provider)
        daemon = start_daemon(env, log, "--until-idle")
        store = Store(sqlite_url)
        wait_for(lambda: [b for b in rows(store, batches_t) if b["status"] == "submitted"])
        wait_for(lambda: any(e["event"] == "batch_polled" for e in events(log)))
        out = subprocess.run([*LEDGER, "cancel", "--batch", "1"], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        # The provider finalizes a cancel over half a second ("cancelling", then "cancelled"); the
        # daemon, seeing the cancel marked, may have sent it first.
        assert re.search(rf"batch 1: {provider} says {canceling}", out.stdout), out.stdout
        assert daemon.wait(timeout=60) == 0
    (batch,) = rows(store, batches_t)
    assert (batch["status"], batch["provider_status"]) == ("canceled", canceled)
    counts = store.status_counts()
    assert counts["completed"] + counts["canceled"] == 40 and counts["canceled"] > 0
    listed = subprocess.run([*LEDGER, "batches", "--json"], env=env, capture_output=True, text=True, check=True)
    (line,) = [json.loads(x) for x in listed.stdout.splitlines()]
    assert set(line) == {
        "id",
        "provider",
        "model",
        "provider_batch_id",
        "status",
        "provider_status",
        "total",
        "completed",
        "failed",
        "age_s",
        "cost_usd",
    }
    assert (line["status"], line["total"], line["completed"], line["failed"]) == (
        "canceled",
        40,
        counts["completed"],
        0,
    )
    assert line["cost_usd"] == pytest.approx(sum(r["cost_usd"] or 0 for r in rows(store, requests_t)))
    first = rows(store, requests_t)[0]
    shown = subprocess.run([*LEDGER, "show", str(first["id"])], env=env, capture_output=True, text=True, check=True)
    assert f"batch: 1 ({provider} {batch['provider_batch_id']}, canceled" in shown.stdout
    store.close()
