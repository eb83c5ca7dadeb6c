"""`--until-idle` ends when the ledger says nothing is left, not at some later poll."""

from __future__ import annotations

import anyio

from adapters.mock import MockAdapter
from ledger.daemon import run_daemon
from ledger.enqueue import build_spec, to_row
from ledger.settings import load_settings
from ledger.store import Store


def test_an_idle_daemon_ends_without_waiting_for_a_poll(sqlite_url: str) -> None:
    # Polls an hour apart: every wait of the run must end on an event, or the deadline fails it.
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=sqlite_url, LEDGER_POLL_INTERVAL=3600)
    store = Store(sqlite_url)
    store.enqueue(
        to_row(
            build_spec(
                provider="mock", model="m", idempotency_key=f"k{i}", messages=[{"role": "user", "content": "hi"}]
            )
        )
        for i in range(20)
    )

    async def run() -> None:
        with anyio.fail_after(60):
            await run_daemon(settings, until_idle=True, handle_signals=False, adapters={"mock": MockAdapter()})

    anyio.run(run)
    assert store.status_counts()["completed"] == 20
    store.close()
