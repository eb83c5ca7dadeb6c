"""The database lane on PostgreSQL: which failures it tries again, and which it must not.

Connections are cut for real (`pg_terminate_backend` on the lane's own backend) at a
chosen moment: while a statement runs, or while the COMMIT is under way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError

from ledger.enqueue import build_spec, to_row
from ledger.record import DbLane
from ledger.store import Store
from ledger.store.queue import CancelResult

T = TypeVar("T")


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    s = Store(pg_url, ping_on_checkout=False)  # as the daemon opens it
    s.enqueue(
        to_row(
            build_spec(model="m", provider="mock", idempotency_key=f"k{i}", messages=[{"role": "user", "content": "q"}])
        )
        for i in range(2)
    )
    yield s
    s.close()


def cut_connection_once(store: Store, moment: str, admin_dsn: str) -> list[int]:
    """Terminate the backend of the next transaction at `moment` ("statement" or "commit"); returns
    a list that records each cut."""
    cuts: list[int] = []
    admin = psycopg.connect(admin_dsn, autocommit=True)

    def cut(dbapi_connection: Any) -> None:
        if not cuts:
            pid = dbapi_connection.info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            admin.close()
            cuts.append(pid)

    if moment == "statement":

        @event.listens_for(store.engine, "before_cursor_execute")
        def _before_statement(conn: Any, cursor: Any, *_: Any) -> None:
            cut(cursor.connection)

    else:

        @event.listens_for(store.engine, "commit")
        def _before_commit(conn: Any) -> None:
            cut(conn.connection.dbapi_connection)

    return cuts


def counted(calls: list[int], fn: Callable[[], T]) -> Callable[[], T]:
    """`fn`, noting each time the lane runs it."""

    def run() -> T:
        calls.append(1)
        return fn()

    return run


def test_a_connection_cut_during_a_statement_is_tried_again_and_applied_once(store: Store, pg_dsn: str) -> None:
    cuts = cut_connection_once(store, "statement", pg_dsn)
    calls: list[int] = []
    result = anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: store.cancel(ids=[1])))
    assert len(cuts) == 1 and len(calls) == 2  # the cut transaction was rolled back, then run again
    assert result == CancelResult(canceled=1, in_flight=0)
    assert store.status_counts()["canceled"] == 1


def test_a_connection_cut_during_commit_is_not_tried_again(store: Store, pg_dsn: str) -> None:
    """Whether that COMMIT landed is unknown: running the transaction again could apply it twice
    (a second attempt row, an attempt counted twice), so the error surfaces instead."""
    cuts = cut_connection_once(store, "commit", pg_dsn)
    calls: list[int] = []
    with pytest.raises(DBAPIError):
        anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: store.cancel(ids=[1])))
    assert len(cuts) == 1 and len(calls) == 1
