"""A spent quota pauses its pool instead of burning retries (both databases, real SDKs against the
mock): OpenAI's 429 `insufficient_quota` and Anthropic's 400 "credit balance is too low"."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from ledger.api import Ledger
from ledger.cli import app
from ledger.daemon import run_daemon
from ledger.enqueue import build_spec
from ledger.events import JsonFormatter
from ledger.settings import Settings
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, requests_t, rows, run
from tests.integration.store_helpers import LogRecords, event_lines, logged

SPENT = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
OTHER = ("openai", "gpt-4o")  # another pool, whose account is fine


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider() as server:
        yield server


@pytest.fixture
def captured() -> Iterator[LogRecords]:
    with event_lines() as lines:
        yield lines


def enqueue(settings: Settings, provider: str, model: str, n: int) -> None:
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(
            build_spec(
                provider=provider,
                model=model,
                messages=[{"role": "user", "content": f"{model} question {i}"}],
                idempotency_key=f"{model}:{i}",
            )
            for i in range(n)
        )


def refused(mock: RunningMockProvider) -> int:
    return int(mock.server.stats()["status_counts"].get("quota", 0))


def by_pool(settings: Settings) -> dict[str, list[dict[str, Any]]]:
    store = Store(settings.database_url)
    try:
        found: dict[str, list[dict[str, Any]]] = {}
        for row in rows(store, requests_t):
            found.setdefault(row["endpoint"], []).append(row)
        return found
    finally:
        store.close()


async def until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll `check` (in a thread: it reads the database) until true, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not await anyio.to_thread.run_sync(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s")
        await anyio.sleep(0.05)


def status(db_url: str) -> dict[str, Any]:
    said = CliRunner().invoke(app, ["status", "--json"], env={"LEDGER_DATABASE_URL": db_url})
    assert said.exit_code == 0, said.output
    return dict(json.loads(said.stdout))


@pytest.mark.parametrize("provider", sorted(SPENT))
def test_a_spent_quota_pauses_its_pool_probes_once_a_period_and_resumes_after_the_reset(
    db_url: str, mock: RunningMockProvider, captured: LogRecords, provider: str
) -> None:
    model = SPENT[provider]
    settings = batch_settings(db_url, mock, LEDGER_QUOTA_RECHECK_SECONDS=1, MAX_CONCURRENT_LLM_CALLS=4)
    pool = f"{provider}:{model}"
    mock.spend_quota(model)
    enqueue(settings, provider, model, 100)
    enqueue(settings, *OTHER, 10)

    def other_done_and_paused() -> bool:
        found = by_pool(settings)
        usage = Store(settings.database_url).pool_usage()
        return all(r["status"] == "completed" for r in found["openai:gpt-4o"]) and bool(usage[pool]["paused_reason"])

    async def go() -> tuple[int, int]:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: run_daemon(settings, stop=stop, handle_signals=False))
            await until(other_done_and_paused)  # the other pool's work completes while this one is paused
            at_pause = refused(mock)
            await until(lambda: refused(mock) >= at_pause + 2)  # two probes, a pause period apart
            mock.spend_quota(model, spent=False)  # the quota resets
            await until(lambda: all(r["status"] == "completed" for r in by_pool(settings)[pool]), timeout=60)
            stop.set()
        return at_pause, refused(mock)

    at_pause, total = anyio.run(go)
    found = by_pool(settings)[pool]
    assert len(found) == 100 and all(r["status"] == "completed" for r in found)  # none ended `error`
    assert all(r["attempts"] - r["parked"] == 1 for r in found)  # a refused call spent no attempt
    pauses = logged(captured, "quota_exhausted")
    assert pauses and all(p["pool"] == pool and p["provider"] == provider and p["level"] == "ERROR" for p in pauses)
    # The JSON line itself says ERROR: that is what an operator's alerting reads.
    lines = [json.loads(JsonFormatter().format(r)) for r in captured.records if r.getMessage() == "quota_exhausted"]
    assert len(lines) == len(pauses) and all(line["level"] == "ERROR" for line in lines)
    said = {"anthropic": "credit balance too low", "openai": "quota exhausted (insufficient_quota)"}[provider]
    assert pauses[0]["reason"].startswith(said)
    # One line per pause, not per request: the first pause, then one per failed probe. Beyond the
    # calls out when the quota was first refused (at most the global limit), one call per probe.
    probes = total - at_pause
    assert len(pauses) == 1 + probes and at_pause <= 4
    assert status(db_url)["slots"]["pools"][pool]["paused_until"] is None


def test_a_pause_shows_in_the_status_and_ledger_pools_resume_lifts_it(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, MAX_CONCURRENT_LLM_CALLS=2)  # a pause of 900 s
    pool = "openai:gpt-4o-mini"
    mock.spend_quota("gpt-4o-mini")
    enqueue(settings, "openai", "gpt-4o-mini", 20)
    enqueue(settings, *OTHER, 5)
    run(settings)  # until idle: what is left waits only for a paused pool
    found = by_pool(settings)
    assert all(r["status"] == "completed" for r in found["openai:gpt-4o"])
    assert all(r["status"] == "queued" and r["attempts"] == r["parked"] for r in found[pool])
    said = status(db_url)["slots"]["pools"][pool]
    assert said["paused_until"] is not None and "insufficient_quota" in said["paused_reason"]
    env = {"LEDGER_DATABASE_URL": db_url}
    text = CliRunner().invoke(app, ["status"], env=env, terminal_width=300).output
    assert f"pool {pool} paused until" in text and f"ledger pools resume {pool}" in text
    calls = mock.server.stats()["calls"]
    mock.spend_quota("gpt-4o-mini", spent=False)
    run(settings)
    assert mock.server.stats()["calls"] == calls  # still paused: nothing was called
    resumed = CliRunner().invoke(app, ["pools", "resume", pool], env=env)
    assert resumed.exit_code == 0 and f"pool {pool} resumed" in resumed.output
    run(settings)
    assert all(r["status"] == "completed" for r in by_pool(settings)[pool])
    again = CliRunner().invoke(app, ["pools", "resume", pool], env=env)
    assert again.exit_code == 1 and f"pool '{pool}' is not paused" in again.output


def test_two_daemons_both_honour_a_pause(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, MAX_CONCURRENT_LLM_CALLS=4)
    mock.spend_quota("gpt-4o-mini")
    enqueue(settings, "openai", "gpt-4o-mini", 50)
    enqueue(settings, *OTHER, 40)

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            for worker in ("one", "two"):
                tg.start_soon(lambda w=worker: run_daemon(settings, until_idle=True, worker_id=w, handle_signals=False))

    anyio.run(go)
    found = by_pool(settings)
    assert all(r["status"] == "completed" for r in found["openai:gpt-4o"])
    assert all(r["status"] == "queued" for r in found["openai:gpt-4o-mini"])
    # Once paused, neither daemon called the pool again: only the calls out at the first refusal.
    assert refused(mock) <= 4
