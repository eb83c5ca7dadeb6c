"""`ledger demo`: the example evaluation job, keyless, start to finish.

`examples/eval/spec.toml` (shipped in the package as `ledger/data/examples/eval/spec.toml`;
3 judges x 10 dimensions over a small artifact), one
request each, through the real OpenAI SDK to the mock provider (which injects a
few 503s so retries show), on a fresh SQLite ledger, daemon limit 5; then the
parsed verdicts become 30 opinions. The JSON event log goes to a file beside the ledger.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio

from adapters.mock_provider import MockProviderConfig, running_mock_provider
from ledger.api import Ledger
from ledger.daemon import run_daemon
from ledger.events import configure_logging
from ledger.settings import load_settings

# The example job users read first; the demo runs exactly it. It ships inside the package
# (ledger/data/examples/eval, package data; the repository's examples/eval links to it), so an
# installed `ledger demo` finds it from any directory, not only from a source checkout.
EXAMPLE_SPEC = Path(__file__).resolve().parent / "data" / "examples" / "eval" / "spec.toml"


def demo_provider(latency: float) -> MockProviderConfig:
    """The demos' mock provider: `latency` per call, some jitter, a few 503s so retries show."""
    return MockProviderConfig(latency=latency, jitter=latency / 3, fault_rates={"503": 0.1}, seed=7)


def run_demo(workdir: Path, *, limit: int = 5, latency: float = 0.3) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    database = workdir / "ledger.db"
    for stale in workdir.glob("ledger.db*"):
        stale.unlink()
    log_path = workdir / "daemon.log"
    with running_mock_provider(demo_provider(latency)) as mock, log_path.open("w") as log:
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
            job_id = ledger.trigger(EXAMPLE_SPEC).job_id
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
        "job_id": job_id,
        "database": str(database),
        "log": str(log_path),
    }
