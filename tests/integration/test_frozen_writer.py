"""A daemon frozen inside a transaction must not stall the others.

PostgreSQL only: SQLite has one write lock per file, and a frozen writer holds it
(docs/decisions.md says what that means for several daemons on one file).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from ledger.enqueue import build_spec, to_row
from ledger.record import DbLane
from ledger.store import Store
from ledger.store.commit import reading, transaction
from tests.acceptance.procs import wait_for

LIMITS = {"lease_seconds": 30.0, "global_limit": 5, "pool_limit": lambda _: 5, "max_attempts": 3, "max_claims": 5}
FREEZE_S = 4.0


def test_a_daemon_frozen_holding_the_claim_lock_is_cut_off_and_the_others_claim(pg_url: str) -> None:
    frozen = Store(pg_url, idle_in_transaction_s=0.5)  # as the daemon opens it (a quarter lease)
    other = Store(pg_url, idle_in_transaction_s=0.5)
    other.enqueue([to_row(build_spec(model="m", provider="mock", messages=[{"role": "user", "content": "hi"}]))])
    holding, woke = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def freeze_inside_the_claim() -> None:
        try:
            with frozen.engine.begin() as conn:
                frozen.dialect.serialize_claimers(conn)
                holding.set()
                time.sleep(FREEZE_S)  # the freeze itself (SIGSTOP, a VM pause): no statement runs
                woke.set()
        except DBAPIError as exc:  # the server ended the idle transaction: what this test wants
            errors.append(exc)
        finally:
            woke.set()

    thread = threading.Thread(target=freeze_inside_the_claim)
    thread.start()
    assert holding.wait(10)
    claimed = other.claim("other", **LIMITS)
    still_frozen = not woke.is_set()
    thread.join()
    assert len(claimed.requests) == 1 and still_frozen  # claimed while the frozen daemon still slept
    assert errors, "the frozen session should have been ended by the server"


def test_ledgers_in_two_schemas_of_one_database_do_not_share_the_claim_lock(pg_url: str, pg_dsn: str) -> None:
    """Advisory locks are database-wide; the claim lock is keyed by schema, so one ledger's claim
    never waits for another's (tenants, test runs and benchmarks side by side)."""
    import psycopg

    other_schema = "t_other_" + pg_url.rsplit("%3D", 1)[1][2:]
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{other_schema}"')
        try:
            mine, other = Store(pg_url), Store(pg_url.rsplit("%3D", 1)[0] + "%3D" + other_schema)
            other.enqueue([to_row(build_spec(model="m", provider="mock", messages=[{"role": "user", "content": "x"}]))])
            claimed: list[int] = []
            with mine.engine.begin() as conn:
                mine.dialect.serialize_claimers(conn)  # a claim in progress in the first ledger, held
                thread = threading.Thread(target=lambda: claimed.append(len(other.claim("other", **LIMITS).requests)))
                thread.start()
                thread.join(timeout=10)  # a shared lock would keep it waiting until this block ends
                finished_while_held = not thread.is_alive()
            thread.join()
            assert finished_while_held and claimed == [1]
            other.close()
            mine.close()
        finally:
            admin.execute(f'DROP SCHEMA "{other_schema}" CASCADE')


def _frozen_until_the_server_ends_the_session(conn: Connection, watcher: Store) -> None:
    """A freeze inside a transaction (SIGSTOP, a VM pause), held until the server has ended the
    session for idling in it: no statement runs meanwhile."""
    pid = conn.connection.driver_connection.info.backend_pid  # type: ignore[union-attr]
    alive = text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")

    def ended() -> bool:
        with watcher.engine.connect() as look:
            return bool(look.execute(alive, {"pid": pid}).scalar_one() == 0)

    wait_for(ended, timeout=10)


def _frozen_store(pg_url: str, watcher: Store) -> Store:
    """A store opened as the daemon opens it, with a short idle bound; the schema and the request
    come first, through `watcher`, so no set-up statement waits under that bound."""
    watcher.enqueue([to_row(build_spec(model="m", provider="mock", messages=[{"role": "user", "content": "r"}]))])
    return Store(pg_url, ping_on_checkout=False, idle_in_transaction_s=0.2)


def test_a_read_frozen_past_the_idle_bound_keeps_its_rows_and_the_store_goes_on(pg_url: str) -> None:
    """The CI failure of the frozen-daemon acceptance test: a daemon frozen inside one of its idle
    loops' reads woke to a dead connection at the read's closing ROLLBACK and stopped (exit 1)."""
    watcher = Store(pg_url)
    frozen = _frozen_store(pg_url, watcher)
    try:
        with reading(frozen.engine) as conn:
            rows = conn.execute(text("SELECT id FROM llm_requests")).all()
            _frozen_until_the_server_ends_the_session(conn, watcher)
        assert len(rows) == 1
        assert frozen.status_counts()["queued"] == 1  # the next read gets a fresh connection
    finally:
        frozen.close()
        watcher.close()


def test_a_write_frozen_past_the_idle_bound_is_not_applied_and_the_lane_runs_it_again(pg_url: str) -> None:
    """The server never ran that COMMIT (it said so, SQLSTATE 25P03): nothing was written, so the
    daemon's lane runs the write again instead of stopping, even without the transaction's id."""
    watcher = Store(pg_url)
    frozen = _frozen_store(pg_url, watcher)
    runs: list[int] = []

    def bump_priority() -> None:
        with transaction(frozen.engine, frozen.dialect) as conn:
            conn.execute(text("UPDATE llm_requests SET priority = priority + 1"))
            runs.append(1)
            if len(runs) == 1:
                _frozen_until_the_server_ends_the_session(conn, watcher)

    async def through_the_lane() -> Any:
        return await DbLane(retry_seconds=10).run(bump_priority)

    try:
        anyio.run(through_the_lane)
        with watcher.engine.connect() as conn:
            priority = conn.execute(text("SELECT priority FROM llm_requests")).scalar_one()
        assert len(runs) == 2  # the lane ran it again
        assert priority == 1  # and it was applied once
    finally:
        frozen.close()
        watcher.close()
