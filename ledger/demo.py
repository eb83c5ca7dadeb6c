"""`ledger demo`: the seed case, keyless, start to finish.

3 agents x 10 dimensions, one request each, through the real OpenAI SDK to the
mock provider (which injects a few 503s so retries show), on a fresh SQLite
ledger, daemon limit 5. The JSON event log goes to a file beside the ledger.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

from adapters.mock_provider import MockProviderConfig, running_mock_provider
from ledger.api import Ledger
from ledger.daemon import run_daemon
from ledger.enqueue import build_spec
from ledger.events import configure_logging
from ledger.settings import load_settings

AGENTS = ("prosecutor", "defense", "judge")
DIMENSIONS = tuple(f"criterion-{i:02d}" for i in range(1, 11))


def seed_case_specs(provider: str = "openai", model: str = "gpt-4o-mini", job_id: str = "demo") -> list[Any]:
    return [
        build_spec(
            provider=provider,
            model=model,
            job_id=job_id,
            idempotency_key=f"{job_id}:{agent}:{dim}",
            system=f"You are the {agent}. Reason step by step, then give a final line 'VERDICT: <1-5>'.",
            messages=[{"role": "user", "content": f"Evaluate the submission on {dim}."}],
            trace={"agent": agent, "dimension": dim, "experiment": job_id},
        )
        for agent in AGENTS
        for dim in DIMENSIONS
    ]


def run_demo(workdir: Path, *, limit: int = 5, latency: float = 0.3) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    database = workdir / "ledger.db"
    for stale in workdir.glob("ledger.db*"):
        stale.unlink()
    log_path = workdir / "daemon.log"
    config = MockProviderConfig(latency=latency, jitter=latency / 3, fault_rates={"503": 0.1}, seed=7)
    with running_mock_provider(config) as mock, log_path.open("w") as log:
        configure_logging("INFO", stream=log)
        settings = load_settings(
            _env_file=None,
            MAX_CONCURRENT_LLM_CALLS=limit,
            RETRY_INITIAL_DELAY=0.2,
            LEDGER_DATABASE_URL=f"sqlite:///{database}",
            OPENAI_BASE_URL=mock.openai_base_url,
            OPENAI_API_KEY="demo-key-not-secret",
        )
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(seed_case_specs())
            started = time.monotonic()
            anyio.run(lambda: run_daemon(settings, until_idle=True))
            wall = time.monotonic() - started
            counts = ledger.store.status_counts()
            attempts = ledger.store.attempt_count()
        stats = mock.stats()
    return {
        "completed": counts["completed"],
        "errors": counts["error"],
        "retries": attempts - sum(counts.values()),
        "max_in_flight": stats["max_in_flight"],
        "wall_s": wall,
        "database": str(database),
        "log": str(log_path),
    }
