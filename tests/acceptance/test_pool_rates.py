"""RPM / TPM caps held across two real daemon processes sharing one PostgreSQL ledger.

The window is shortened for the test (LEDGER_RATE_WINDOW_SECONDS, a test-only knob) and
the mock provider enforces its own, looser, requests-per-window cap: any call the ledger
let through beyond it would come back as a 429.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger.store import Store
from tests.acceptance.procs import enqueue, ledger_env, mock_provider, start_daemon

# Rates and windows that real processes keep: run alone, after the parallel part (the test command).
pytestmark = pytest.mark.timing

POOL = "openai:gpt-4o-mini"
WINDOW = 2.0


def most_in_any_window(points: list[tuple[float, int]], window: float) -> int:
    """The largest sum of weights over (start time, weight) points falling in any `window` seconds."""
    points.sort()
    most = 0
    for i, (start, _) in enumerate(points):
        most = max(most, sum(w for t, w in points[i:] if t < start + window))
    return most


def _seconds(value: object) -> float:
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    assert isinstance(when, datetime)
    return when.timestamp()


@pytest.mark.parametrize(("cap", "n"), [("rpm", 24), ("tpm", 24)])
def test_two_daemons_on_postgres_share_the_pools_rpm_and_tpm(pg_url: str, tmp_path: Path, cap: str, n: int) -> None:
    requests = tmp_path / "requests.jsonl"
    with requests.open("w") as f:
        for i in range(n):
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"rate probe {i}"}]}
            f.write(json.dumps({**body, "max_tokens": 40}) + "\n")
    limit = {"rpm": {"LEDGER_POOL_RPM": f"{POOL}=8"}, "tpm": {"LEDGER_POOL_TPM": f"{POOL}=400"}}[cap]
    with mock_provider("--latency", "0.05", "--rpm", "10", "--rpm-window", str(WINDOW)) as mock:
        env = ledger_env(
            pg_url,
            mock,
            MAX_CONCURRENT_LLM_CALLS=8,
            LEDGER_RATE_WINDOW_SECONDS=WINDOW,
            LEDGER_POLL_INTERVAL=0.05,
            **limit,
        )
        enqueue(env, requests)
        daemons = [start_daemon(env, tmp_path / f"d{k}.log", "--until-idle", "--worker-id", f"d{k}") for k in (1, 2)]
        try:
            codes = [d.wait(timeout=120) for d in daemons]
        finally:
            for d in daemons:
                if d.poll() is None:
                    d.kill()
        stats = mock.stats()
    assert codes == [0, 0], [(tmp_path / f"d{k}.log").read_text()[-2000:] for k in (1, 2)]
    store = Store(pg_url)
    with store.engine.connect() as conn:
        calls = conn.execute(
            text(
                "SELECT a.started_at, a.worker, COALESCE(r.input_tokens, 0) + COALESCE(r.output_tokens, 0)"
                " FROM llm_attempts a JOIN llm_requests r ON r.id = a.request_id"
            )
        ).all()
    counts = store.status_counts()
    store.close()
    assert counts["completed"] == n
    assert stats["status_counts"] == {"200": n}  # the provider's own cap never refused one
    assert {worker for _, worker, _ in calls} == {"d1", "d2"}  # both daemons called
    if cap == "rpm":
        assert most_in_any_window([(_seconds(t), 1) for t, _, _ in calls], WINDOW) <= 8
    else:
        assert most_in_any_window([(_seconds(t), int(used)) for t, _, used in calls], WINDOW) <= 400
    started = sorted(_seconds(t) for t, _, _ in calls)
    assert started[-1] - started[0] >= WINDOW  # the caps made the run wait for the window
