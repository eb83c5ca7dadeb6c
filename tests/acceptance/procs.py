"""Real processes for acceptance tests: the mock provider, daemons, and their logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from adapters.mock_provider import MockProviderProcess as MockProcess
from adapters.mock_provider import mock_provider_process

LEDGER = [sys.executable, "-m", "ledger.cli"]


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy; fail with a clear message at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def mock_provider(*args: str) -> AbstractContextManager[MockProcess]:
    """The mock provider started through the CLI (`ledger mock-provider`), as a user would."""
    return mock_provider_process(*args, command=[*LEDGER, "mock-provider"])


def ledger_env(db_url: str, mock: MockProcess | None = None, **settings: object) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LEDGER_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))
    }
    env["LEDGER_DATABASE_URL"] = db_url
    if mock is not None:
        env["OPENAI_BASE_URL"] = mock.openai_base_url
        env["ANTHROPIC_BASE_URL"] = mock.base_url
        env["OPENAI_COMPATIBLE_BASE_URL"] = mock.openai_base_url
        env["GOOGLE_GEMINI_BASE_URL"] = mock.base_url
    env.setdefault("OPENAI_API_KEY", "test-key")
    env.setdefault("GEMINI_API_KEY", "test-key")
    env.setdefault("ANTHROPIC_API_KEY", "test-key")
    env.update({k: str(v) for k, v in settings.items()})
    return env


def start_daemon(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen([*LEDGER, "daemon", *args], env=env, stdout=sink, stderr=sink)


def run_daemon(env: dict[str, str], log: Path, *args: str, timeout: float = 120) -> int:
    proc = start_daemon(env, log, "--until-idle", *args)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"daemon did not become idle within {timeout}s; log: {log.read_text()[-2000:]}") from None


def events(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def max_slots_from_log(records: list[dict[str, Any]]) -> int:
    """Replay acquired/released in timestamp order: the most slots ever held at once."""
    held = peak = 0
    for event in sorted((e for e in records if e["event"] in ("acquired", "released")), key=lambda e: e["ts"]):
        held += 1 if event["event"] == "acquired" else -1
        peak = max(peak, held)
    return peak


def balanced(records: list[dict[str, Any]]) -> bool:
    """Request by request, every slot acquired in the log was released in the log exactly once
    (by its daemon, or by whoever reclaimed it): a double release cannot hide a missing one."""
    acquired = Counter(e["request_id"] for e in records if e["event"] == "acquired")
    released = Counter(e["request_id"] for e in records if e["event"] == "released")
    return acquired == released


def write_requests(path: Path, prompts: list[tuple[str, str, str]], model: str = "gpt-4o-mini") -> Path:
    """(agent, dimension, prompt) triples as bare chat bodies with metadata."""
    with path.open("w") as f:
        for agent, dimension, prompt in prompts:
            f.write(
                json.dumps(
                    {
                        "model": model,
                        "messages": [{"role": "user", "content": prompt}],
                        "metadata": {"agent": agent, "dimension": dimension},
                    }
                )
                + "\n"
            )
    return path


def enqueue(env: dict[str, str], path: Path, *flags: str) -> None:
    subprocess.run([*LEDGER, "enqueue", str(path), *flags], env=env, check=True, capture_output=True)


def counts_and_most_successes(url: str) -> tuple[dict[str, int], int]:
    """Requests per status, and the most `succeeded` attempts any one request has (1: nothing
    was answered and recorded twice)."""
    from sqlalchemy import text

    from ledger.store import Store

    store = Store(url)
    try:
        counts = store.status_counts()
        with store.engine.connect() as conn:
            most = conn.execute(
                text(
                    "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM llm_attempts"
                    " WHERE outcome = 'succeeded' GROUP BY request_id) s"
                )
            ).scalar_one()
    finally:
        store.close()
    return counts, int(most)
