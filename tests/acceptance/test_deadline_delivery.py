"""Delivery `auto` with real processes: a daemon killed outright between sending a batch's cancel at
the deadline margin and calling its requests online; the restart loses nothing and answers
nothing twice. The real SDKs talk to the mock provider over HTTP."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from ledger.store import Store
from tests.acceptance.procs import (
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

MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
ENV = {
    "LEDGER_PROVIDER_BATCH_WAIT": 0,
    "LEDGER_BATCH_POLL_INTERVAL": 0.1,
    "LEDGER_POLL_INTERVAL": 0.1,
}


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_a_daemon_killed_after_the_fallback_cancel_loses_nothing_and_answers_nothing_twice(
    db_url: str, tmp_path: Path, provider: str
) -> None:
    log = tmp_path / "daemon.log"
    with mock_provider("--batch-latency", "50") as mock:  # 2 % of a batch answered a second
        env = ledger_env(db_url, mock, **ENV)
        path = write_requests(tmp_path / "r.jsonl", [("a", f"d{i}", f"r {i}") for i in range(100)], MODELS[provider])
        enqueue(env, path, "--provider", provider, "--delivery", "auto", "--deadline", "1h")
        store = Store(db_url)
        submitter = start_daemon(env, log, "--worker-id", "submitter")  # the default margin: 30 min
        wait_for(lambda: [b["status"] for b in rows(store, batches_t)] == ["submitted"], timeout=60)
        submitter.send_signal(signal.SIGTERM)
        assert submitter.wait(timeout=60) == 0
        # A daemon whose margin is past already: it cancels the batch at once, and dies (SIGKILL)
        # right after the provider took the cancel, before anything went online.
        late = {**env, "LEDGER_DEADLINE_MARGIN_SECONDS": "3660"}
        code = run_daemon({**late, "LEDGER_STOP_AT": "deadline_cancel_sent"}, log, "--worker-id", "w", timeout=60)
        assert code == -signal.SIGKILL
        (batch,) = rows(store, batches_t)
        assert batch["cancel_sent_at"] is not None and batch["status"] == "submitted"
        assert {r["status"] for r in rows(store, requests_t)} == {"submitted"}  # none online yet

        assert run_daemon(late, log, "--worker-id", "w", timeout=60) == 0
        assert mock.stats()["batch_creates"] == {provider: 1}
    requests = rows(store, requests_t)
    assert all(r["status"] == "completed" for r in requests)
    via = Counter(r["answered_via"] for r in requests)
    assert via["batch"] > 0 and via["online"] > 0 and via["batch"] + via["online"] == 100
    results = Counter(a["request_id"] for a in rows(store, attempts_t) if a["outcome"] == "succeeded")
    assert results == Counter({r["id"]: 1 for r in requests})  # one answer each, none twice
    assert all(r["completed_at"] <= r["deadline"] for r in requests)
    fallbacks = [e for e in events(log) if e["event"] == "deadline_fallback"]
    assert sum(e["requests"] for e in fallbacks) == via["online"]
    store.close()
