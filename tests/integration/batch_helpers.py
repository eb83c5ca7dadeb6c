"""Helpers for provider-batch tests: enqueue batch requests, run a daemon in-process, read back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import select

from adapters.mock_provider import RunningMockProvider
from ledger.api import Ledger
from ledger.daemon import DaemonReport, run_daemon
from ledger.enqueue import build_spec
from ledger.jobs import trigger
from ledger.models import LlmAttempt, LlmBatch, LlmRequest
from ledger.settings import Settings, load_settings
from ledger.spec import AgentSpec, JobSpec, load_spec
from ledger.store import Store

requests_t = LlmRequest.__table__  # type: ignore[attr-defined]
attempts_t = LlmAttempt.__table__  # type: ignore[attr-defined]
batches_t = LlmBatch.__table__  # type: ignore[attr-defined]


def batch_settings(db_url: str, mock: RunningMockProvider, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "LEDGER_DATABASE_URL": db_url,
        "OPENAI_BASE_URL": mock.openai_base_url,
        "ANTHROPIC_BASE_URL": mock.anthropic_base_url,
        "OPENAI_COMPATIBLE_BASE_URL": mock.openai_base_url,
        "OPENAI_API_KEY": "test-key",
        "ANTHROPIC_API_KEY": "test-key",
        "GOOGLE_GEMINI_BASE_URL": mock.base_url,
        "GEMINI_API_KEY": "test-key",
        "LEDGER_PROVIDER_BATCH_WAIT": 0,
        "LEDGER_BATCH_POLL_INTERVAL": 0.05,
        "LEDGER_POLL_INTERVAL": 0.05,
        "RETRY_INITIAL_DELAY": 0,
        "LEDGER_SHUTDOWN_GRACE": 1,
    }
    values.update(overrides)
    return load_settings(**values)


def enqueue(
    settings: Settings,
    prompts: list[str],
    *,
    provider: str = "openai",
    model: str = "gpt-4o-mini",
    params: dict[str, Any] | None = None,
    job_id: str | None = None,
    delivery: str = "batch",
) -> None:
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(
            build_spec(
                model=model,
                provider=provider,
                messages=[{"role": "user", "content": prompt}],
                params=params or {},
                delivery=delivery,
                job_id=job_id,
                idempotency_key=f"{provider}:{model}:{job_id}:{i}:{prompt}",
            )
            for i, prompt in enumerate(prompts)
        )


def run(settings: Settings, timeout: float = 60) -> DaemonReport:
    async def go() -> DaemonReport:
        with anyio.fail_after(timeout):
            return await run_daemon(settings, until_idle=True, handle_signals=False)

    return anyio.run(go)


def rows(store: Store, table: Any, *where: Any) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(table).where(*where).order_by(table.c.id))]


EXAMPLE_SPEC = Path(__file__).resolve().parents[2] / "examples" / "eval" / "spec.toml"


def example_with_judge(settings: Settings, provider: str, model: str, job_id: str) -> tuple[Store, JobSpec]:
    """The example evaluation under `job_id`, its first judge on `provider`/`model`, run until idle
    and checked complete (30 scored opinions); the store to look further, and the spec."""
    spec = load_spec(EXAMPLE_SPEC)
    judge = AgentSpec(**{**spec.agents[0].__dict__, "provider": provider, "model": model})
    spec = replace(spec, id=job_id, agents=(judge, *spec.agents[1:]))
    store = Store(settings.database_url)
    trigger(store, settings, spec)
    run(settings)
    job = store.get_job(job_id)
    assert job is not None and job["status"] == "completed"
    opinions = store.opinions(job_id)
    assert len(opinions) == 30 and all(o["score"] is not None for o in opinions)
    return store, spec
