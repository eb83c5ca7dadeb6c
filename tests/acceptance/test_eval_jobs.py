"""Evaluation jobs with real processes: `ledger eval` end to end, refusals, two jobs under one
daemon, cancel by job id, a kill -9 mid-job, and two daemons under a daily budget. The real
OpenAI SDK talks to the mock provider over HTTP; expected scores are computed, never hard-coded."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from adapters.mock_provider.answers import mock_verdict
from ledger.jobs import trigger
from ledger.models import Job, Opinion
from ledger.settings import load_settings
from ledger.spec import load_spec
from ledger.store import Store
from tests.acceptance.procs import (
    LEDGER,
    events,
    ledger_env,
    mock_provider,
    run_daemon,
    start_daemon,
    wait_for,
)
from tests.integration.batch_helpers import attempts_t, requests_t, rows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eval" / "spec.toml"
EXAMPLE_ID = "example-eval"
jobs_t = Job.__table__  # type: ignore[attr-defined]
opinions_t = Opinion.__table__  # type: ignore[attr-defined]
# Quick polls and back-offs: the tests wait on the ledger, not on its default pacing. Deadlines
# (wait_for, run_daemon) are generous: they cost nothing when things go well, and the machine
# may be shared.
FAST: dict[str, object] = {"LEDGER_POLL_INTERVAL": 0.05, "RETRY_INITIAL_DELAY": 0.05, "RETRY_MAX_DELAY": 0.1}

Cell = tuple[str, str]


def ledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEDGER, *args], env=env, capture_output=True, text=True, timeout=180)


def trigger_here(env: dict[str, str], *specs: Path) -> None:
    """Stage jobs as `ledger eval SPEC` does, in this process (the CLI itself is tested above):
    a Python start-up saved per job, the daemons that run them stay real processes."""
    settings = load_settings(**env)
    store = Store(settings.database_url)
    try:
        for spec in specs:
            assert trigger(store, settings, load_spec(spec)).created
    finally:
        store.close()


def write_spec(
    path: Path,
    job_id: str,
    *,
    agents: dict[str, str] | None = None,
    dims: int = 3,
    budget_usd: float | None = None,
    extra_dim_ids: tuple[str, ...] = (),
) -> Path:
    """A TOML spec: `agents` maps judge name -> system prompt (mock directives go there)."""
    lines = [f"id = {json.dumps(job_id)}"]
    if budget_usd is not None:
        lines.append(f"budget_usd = {budget_usd}")
    artifact = f"def add(a, b):  # {job_id}\n    return a - b\n"
    lines += ["", "[artifact]", f"text = {json.dumps(artifact)}"]
    for name, system in (agents or {"judge": "You are a careful judge."}).items():
        lines += [
            "",
            "[[agents]]",
            f"name = {json.dumps(name)}",
            'provider = "openai"',
            'model = "gpt-4o-mini"',
            f"system = {json.dumps(system)}",
            "params = { temperature = 0, max_tokens = 200 }",
        ]
    for dim_id in [f"d{i:02d}" for i in range(dims)] + list(extra_dim_ids):
        lines += [
            "",
            "[[dimensions]]",
            f"id = {json.dumps(dim_id)}",
            f'name = "Dimension {dim_id}"',
            f'instruction = "Rate aspect {dim_id} of the code."',
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def expected_scores(store: Store, job_id: str) -> dict[Cell, int]:
    """The verdict the mock answers each of the job's requests, from the stored inputs."""
    found: dict[Cell, int] = {}
    for listed in store.list_requests(job_id=job_id, limit=10_000):
        full = store.get_request(listed["id"])
        assert full is not None and full["trace"]["mode"] == "single"
        cell = (full["trace"]["agent"], full["trace"]["dimension"])
        found[cell] = mock_verdict(full["model"], full["input"].get("system"), full["input"]["messages"])
    return found


def opinions_of(store: Store, job_id: str) -> list[dict[str, Any]]:
    return rows(store, opinions_t, opinions_t.c.job_id == job_id)


def scores_of(store: Store, job_id: str) -> dict[Cell, int | None]:
    found = opinions_of(store, job_id)
    cells = {(o["agent"], o["dimension"]): o["score"] for o in found}
    assert len(cells) == len(found)  # one opinion per (agent, dimension)
    return cells


def job_of(store: Store, job_id: str) -> dict[str, Any]:
    job = store.get_job(job_id)
    assert job is not None, f"no job {job_id}"
    return job


def nothing_written_for(store: Store, job_id: str) -> bool:
    return store.get_job(job_id) is None and not store.list_requests(job_id=job_id)


def succeeded_attempts(store: Store) -> Counter[int]:
    return Counter(a["request_id"] for a in rows(store, attempts_t) if a["outcome"] == "succeeded")


# -- 1. `ledger eval --wait` with no daemon, then `reparse` and `report` --------------------------


def test_eval_wait_runs_the_example_job_in_process_then_reparse_calls_nothing(db_url: str) -> None:
    with mock_provider() as mock:
        env = ledger_env(db_url, mock, **FAST)
        done = ledger(env, "eval", str(EXAMPLE), "--wait", "--json")
        assert done.returncode == 0, done.stderr[-2000:]
        said = json.loads(done.stdout)
        store = Store(db_url)
        assert (said["job_id"], said["created"], said["requests"], said["status"]) == (
            EXAMPLE_ID,
            True,
            30,
            "completed",
        )
        expected = expected_scores(store, EXAMPLE_ID)
        assert len(expected) == 30 and len(said["opinions"]) == 30
        assert {(o["agent"], o["dimension"]): o["score"] for o in said["opinions"]} == expected
        assert scores_of(store, EXAMPLE_ID) == expected
        calls = mock.stats()["calls"]
        assert calls == 30

        again = ledger(env, "reparse", EXAMPLE_ID)
        assert again.returncode == 0, again.stderr
        assert mock.stats()["calls"] == calls  # reparse reads stored raw output only
        listed = ledger(env, "report", EXAMPLE_ID, "--json")
        assert listed.returncode == 0, listed.stderr
    reported = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    assert sorted((o["agent"], o["dimension"], o["score"]) for o in reported) == sorted(
        (agent, dimension, score) for (agent, dimension), score in expected.items()
    )
    assert job_of(store, EXAMPLE_ID)["status"] == "completed"
    store.close()


# -- 2. Refusals: capacity, budget, a bad spec; nothing written ------------------------------------


def test_refused_triggers_exit_with_one_line_and_write_nothing(sqlite_url: str, tmp_path: Path) -> None:
    db_url = sqlite_url  # the refusals' SQL runs on both databases in tests/integration
    env = ledger_env(db_url, None, LEDGER_JOB_CAPACITY=1)
    first = ledger(env, "eval", str(write_spec(tmp_path / "first.toml", "first")))
    assert first.returncode == 0, first.stderr
    store = Store(db_url)
    before = len(rows(store, requests_t))
    assert before == 3

    second = ledger(env, "eval", str(write_spec(tmp_path / "second.toml", "second")))
    assert second.returncode == 3
    assert second.stderr.splitlines() == ["Cannot trigger: at capacity (1 active jobs, limit is 1)"]
    assert nothing_written_for(store, "second")

    broke = ledger_env(db_url, None, LEDGER_DAILY_BUDGET_USD=0)
    third = ledger(broke, "eval", str(write_spec(tmp_path / "third.toml", "third")))
    assert third.returncode == 3
    assert third.stderr.splitlines() == ["Cannot trigger: budget exhausted ($0.00 of $0.00 spent today)"]
    assert nothing_written_for(store, "third")

    bad = write_spec(tmp_path / "bad.toml", "bad", dims=2, extra_dim_ids=("d01",))
    refused = ledger(ledger_env(db_url, None), "eval", str(bad))
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert str(bad) in line and "dimensions[2].id" in line and "duplicate" in line, line
    assert nothing_written_for(store, "bad")
    assert len(rows(store, requests_t)) == before and [j["id"] for j in rows(store, jobs_t)] == ["first"]
    store.close()


# -- 3. Two jobs under one daemon; cancel one job by id --------------------------------------------


def test_a_failing_job_and_a_sound_one_both_complete_under_one_daemon(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider() as mock:
        env = ledger_env(db_url, mock, **FAST)
        failing = write_spec(tmp_path / "a.toml", "job-a", agents={"judge": "Judge. [[mock:fail=503x*]]"})
        sound = write_spec(tmp_path / "b.toml", "job-b", agents={"judge": "Judge.", "critic": "Criticise."})
        trigger_here(env, failing, sound)
        assert run_daemon(env, log) == 0
    store = Store(db_url)
    a, b = job_of(store, "job-a"), job_of(store, "job-b")
    assert a["status"] == "completed" and b["status"] == "completed"

    failed = opinions_of(store, "job-a")
    assert len(failed) == 3
    assert all(o["score"] is None and o["argument"] == "Evaluation failed after 3 retries" for o in failed)
    assert len(a["errors"]) == 3 and all("ended error after 3 attempts" in e for e in a["errors"])
    assert sorted(e["dimension"] for e in events(log) if e["event"] == "evaluation_failed") == ["d00", "d01", "d02"]

    expected = expected_scores(store, "job-b")
    assert len(expected) == 6 and scores_of(store, "job-b") == expected and not b["errors"]
    ended = {e["job_id"]: e for e in events(log) if e["event"] == "job_ended"}
    assert (ended["job-a"]["status"], ended["job-a"]["errors"]) == ("completed", 3)
    assert (ended["job-b"]["status"], ended["job-b"]["errors"]) == ("completed", 0)
    store.close()


def test_cancel_by_job_id_ends_that_job_only_and_its_calls_become_no_opinions(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider() as mock:
        env = ledger_env(db_url, mock, **FAST, MAX_CONCURRENT_LLM_CALLS=4)
        # C's calls are answered only once the mock's latch opens: certainly in flight at the cancel.
        held = write_spec(tmp_path / "c.toml", "job-c", agents={"judge": "Judge. [[mock:hold]]"})
        plain = write_spec(tmp_path / "d.toml", "job-d")
        trigger_here(env, held, plain)
        store = Store(db_url)
        daemon = start_daemon(env, log, "--until-idle")
        try:
            wait_for(
                lambda: store.status_counts("job-c").get("running", 0) > 0 and mock.stats()["in_flight"] > 0,
                timeout=60,
            )
            canceled = ledger(env, "cancel", "--job", "job-c")
            assert canceled.returncode == 0, canceled.stderr
            assert "job job-c canceled" in canceled.stdout
            mock.release()  # the held calls return now, after the cancel
            assert daemon.wait(timeout=120) == 0
        finally:
            if daemon.poll() is None:
                daemon.kill()
    c, d = job_of(store, "job-c"), job_of(store, "job-d")
    assert c["status"] == "canceled" and d["status"] == "completed"
    c_counts = {status: n for status, n in store.status_counts("job-c").items() if n}
    assert set(c_counts) == {"canceled"}, c_counts  # every call of C was held: none completed
    late = [o for o in opinions_of(store, "job-c") if o["created_at"] >= c["completed_at"]]
    assert late == []  # nothing the canceled job's calls returned became an opinion
    assert scores_of(store, "job-d") == expected_scores(store, "job-d")
    assert not [e for e in events(log) if e["event"] == "job_ended" and e["job_id"] == "job-c"]
    store.close()


# -- 4. kill -9 mid-job, then a restart finishes it -------------------------------------------------


def test_a_daemon_killed_mid_job_is_finished_by_the_next_with_one_opinion_per_cell(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider("--latency", "0.15") as mock:
        env = ledger_env(db_url, mock, **FAST, MAX_CONCURRENT_LLM_CALLS=2)
        trigger_here(env, EXAMPLE)
        store = Store(db_url)
        victim = start_daemon(env, log, "--worker-id", "evaluator")
        wait_for(lambda: 0 < store.status_counts(EXAMPLE_ID).get("completed", 0) < 30, timeout=60)
        wait_for(lambda: mock.stats()["in_flight"] > 0, timeout=60)  # killed with calls in flight
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        partly = store.status_counts(EXAMPLE_ID).get("completed", 0)
        assert run_daemon(env, log, "--worker-id", "evaluator") == 0
    assert 0 < partly < 30
    job = job_of(store, EXAMPLE_ID)
    assert job["status"] == "completed" and not job["errors"]
    with store.engine.connect() as conn:
        count = conn.execute(
            select(func.count()).select_from(opinions_t).where(opinions_t.c.job_id == EXAMPLE_ID)
        ).scalar_one()
    assert count == 30
    assert scores_of(store, EXAMPLE_ID) == expected_scores(store, EXAMPLE_ID)
    requests = rows(store, requests_t)
    assert len(requests) == 30 and all(r["status"] == "completed" for r in requests)
    assert succeeded_attempts(store) == Counter({r["id"]: 1 for r in requests})  # lost ones aside
    assert not [e for e in events(log) if e["event"] == "evaluation_failed"]
    (ended,) = [e for e in events(log) if e["event"] == "job_ended"]
    assert (ended["status"], ended["opinions"]) == ("completed", 30)
    store.close()


# -- 5. Two daemons on PostgreSQL under a daily budget ----------------------------------------------


def test_two_daemons_never_spend_past_the_daily_budget(pg_url: str, tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    # A steep price, so that a handful of requests' worst cases make a budget.
    prices.write_text('[openai.models]\n"gpt-4o-mini" = { input = 1000.0, output = 1000.0 }\n', encoding="utf-8")
    logs = [tmp_path / "d1.log", tmp_path / "d2.log"]
    spec = write_spec(tmp_path / "spend.toml", "spend", agents={"a": "Judge A.", "b": "Judge B."}, dims=6)
    with mock_provider("--latency", "0.1") as mock:
        env = ledger_env(pg_url, mock, **FAST, LEDGER_PRICES_FILE=prices, MAX_CONCURRENT_LLM_CALLS=4)
        trigger_here(env, spec)  # with no daily budget: staging is not refused, nothing reserved yet
        store = Store(pg_url)
        estimates = sorted(float(r["estimate_usd"]) for r in rows(store, requests_t))
        assert len(estimates) == 12 and estimates[0] > 0.1
        budget = round(sum(estimates[-3:]) + estimates[0] / 2, 4)  # about three worst cases fit
        daemons = [start_daemon({**env, "LEDGER_DAILY_BUDGET_USD": str(budget)}, log) for log in logs]
        try:
            settled = _quiet(store, polls=20)
            wait_for(settled, timeout=90, interval=0.05)
        finally:
            for daemon in daemons:
                daemon.send_signal(signal.SIGTERM)
            codes = [daemon.wait(timeout=60) for daemon in daemons]
        calls = mock.stats()["calls"]
    assert codes == [0, 0]
    requests = rows(store, requests_t)
    statuses = Counter(r["status"] for r in requests)
    completed = [r for r in requests if r["status"] == "completed"]
    spent = sum(float(r["cost_usd"]) for r in completed)
    assert completed and statuses["queued"] > 0 and set(statuses) == {"completed", "queued"}, statuses
    assert spent <= budget + max(estimates), (spent, budget)  # never past the cap by more than one call
    assert spent + min(estimates) > budget, (spent, budget)  # what waits is what the budget cannot pay for
    assert calls == len(completed)  # nothing was called that is not accounted for
    assert all(r["reserved_usd"] is None for r in requests)  # every reservation settled
    assert job_of(store, "spend")["status"] == "running"  # waiting for tomorrow's budget, not failed
    store.close()


def _quiet(store: Store, *, polls: int) -> Any:
    """A predicate: nothing running and nothing newly completed for `polls` polls in a row."""
    seen: list[tuple[int, int]] = []

    def check() -> bool:
        counts = store.status_counts()
        seen.append((counts.get("running", 0), counts.get("completed", 0)))
        recent = seen[-polls:]
        return len(recent) == polls and recent[0][1] > 0 and all(s == (0, recent[0][1]) for s in recent)

    return check
