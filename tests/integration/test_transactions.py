"""How the store opens its transactions. On PostgreSQL the store sends BEGIN itself (the driver is
in autocommit mode): with the transaction's first query when that query is the hot statements'
one (a round trip fewer per group commit), or on its own before any other first statement.
Either way nothing may run outside the transaction."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from ledger.record import DbLane
from ledger.store import Store
from ledger.store.commit import transaction
from ledger.store.rows import Completed, Outcome, Written
from tests.integration.store_helpers import add_requests, daemon_store

_LIMITS: dict[str, Any] = {"lease_seconds": 30, "global_limit": 4, "pool_limit": lambda _: 4, "max_attempts": 3}


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with daemon_store(db_url, queued=8) as s:
        yield s


class _Boom(Exception):
    pass


@pytest.mark.parametrize("first", ["the hot statements' query", "a statement of SQLAlchemy's"])
def test_a_transaction_that_fails_leaves_nothing_whichever_statement_went_first(store: Store, first: str) -> None:
    mark = text("UPDATE llm_requests SET purpose = 'touched' WHERE id = 1")
    with pytest.raises(_Boom), transaction(store.engine, store.dialect) as conn:
        if first == "a statement of SQLAlchemy's":
            conn.execute(mark)
        else:
            store.dialect.run_all(conn, [(mark, {})])
        conn.execute(text("UPDATE llm_requests SET purpose = 'touched' WHERE id = 2"))
        raise _Boom
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM llm_requests WHERE purpose = 'touched'")).scalar_one() == 0


def test_hot_statements_on_a_connection_not_yet_in_a_transaction_begin_one(store: Store) -> None:
    with store.engine.connect() as conn:
        store.dialect.run_all(conn, [(text("UPDATE llm_requests SET purpose = 'touched' WHERE id = 1"), {})])
        assert conn.in_transaction()
    # closed without a commit: rolled back
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM llm_requests WHERE purpose = 'touched'")).scalar_one() == 0


def test_a_transaction_goes_on_inside_itself_after_its_first_query_was_refused_whole(store: Store) -> None:
    """PostgreSQL parses a query whole before it runs any of it: refused, its BEGIN never ran
    either, and the transaction's next statement must still begin it."""
    with pytest.raises(_Boom), transaction(store.engine, store.dialect) as conn:
        with pytest.raises(DBAPIError):  # (SQLite says OperationalError, PostgreSQL ProgrammingError)
            store.dialect.run_all(conn, [(text("UPDATE llm_requests SET purpose = 'touched' WHER id = 1"), {})])
        conn.execute(text("UPDATE llm_requests SET purpose = 'touched' WHERE id = 2"))
        raise _Boom
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM llm_requests WHERE purpose = 'touched'")).scalar_one() == 0


def _traced(store: Store, trace: Path, work: Callable[[], Any]) -> tuple[Any, list[tuple[str, str]]]:
    """`work` run with libpq's trace of the messages each checked-out connection sends: its
    result, and (message, first 60 characters of its text) for each message sent."""
    traced: list[Any] = []
    with trace.open("w") as sink:

        @event.listens_for(store.engine, "checkout")
        def _trace(dbapi_conn: Any, *_: Any) -> None:
            dbapi_conn.pgconn.trace(sink.fileno())
            traced.append(dbapi_conn)

        try:
            result = work()
        finally:
            event.remove(store.engine, "checkout", _trace)
            for dbapi_conn in traced:  # before the file closes: nothing more goes to it
                dbapi_conn.pgconn.untrace()
    return result, re.findall(r"\bF\s+\d+\s+(\w+)\s+\"(.{0,60})", trace.read_text())


def _group_commit(store: Store, claimed: list[Any] | None = None) -> Any:
    """A group commit that completes `claimed` (else four requests claimed now) and claims the next."""
    running = claimed if claimed is not None else store.claim("w1", max_claims=4, **_LIMITS).requests
    outcomes: list[Outcome] = [Completed(r, r.attempt, "ok", 1) for r in running]
    return lambda: store.record(outcomes, claim_for="w1", max_claims=4, reclaim=False, **_LIMITS)


def test_postgresql_sends_a_group_commit_s_begin_in_its_first_query(pg_url: str, tmp_path: Path) -> None:
    """Traced at the wire (libpq's trace of the messages the client sends): the group commit's
    BEGIN, claim lock, writes and reads go as one query, and nothing goes before it: the
    statements it prepares go in the session's first few group commits, never again."""
    with daemon_store(pg_url, queued=32) as store:
        first, sent_first = _traced(store, tmp_path / "first.trace", _group_commit(store))
        runs = [first]
        for _ in range(3):  # each prepares what the one before met inside its transaction
            runs.append(_group_commit(store, runs[-1].claim.requests)())
        recorded, sent = _traced(store, tmp_path / "wire.trace", _group_commit(store, runs[-1].claim.requests))
    for done in (*runs, recorded):
        assert done.written == [Written.APPLIED] * 4 and done.claim is not None
        assert len(done.claim.requests) == 4
    assert any(q.startswith("PREPARE") for _, q in sent_first), sent_first
    queries = [q for kind, q in sent if kind == "Query"]
    assert not any("PREPARE" in q for q in queries), queries  # nothing prepared again
    assert queries, sent
    assert queries[0].startswith("BEGIN;"), queries
    assert not any(q.strip('"') == "BEGIN" for q in queries), queries
    assert queries[-1].startswith("COMMIT"), queries


def test_postgresql_plans_a_group_commit_s_statements_once_and_keeps_the_plans(pg_url: str) -> None:
    """A group commit's statements are prepared in the session: after a few group commits
    the server runs most of them on a plan it keeps, instead of planning each again."""
    with daemon_store(pg_url, queued=100) as store:
        claimed = None
        for _ in range(20):
            recorded = _group_commit(store, claimed)()
            assert recorded.claim is not None and len(recorded.claim.requests) == 4
            claimed = recorded.claim.requests
        with store.engine.connect() as conn:  # the pool's one connection: the same session
            plans = conn.execute(
                text("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name LIKE 'ledger_hot_%'")
            ).all()
    assert len(plans) >= 8, plans
    assert sum(1 for generic, _ in plans if generic > 0) >= len(plans) // 2, plans


def test_a_statement_the_server_will_not_prepare_is_sent_whole_and_runs(pg_url: str) -> None:
    """`$1 + $2` cannot be prepared (the server cannot tell which `+`); with its values in
    place it runs. Refused once, it is never tried again in that session."""
    ambiguous = text("SELECT :a + :b AS total")
    with daemon_store(pg_url) as store:
        for a in range(3):
            with transaction(store.engine, store.dialect) as conn:
                (ran,) = store.dialect.run_all(conn, [(ambiguous, {"a": a, "b": 2})])
                assert ran.rows[0].total == a + 2
        with store.engine.connect() as conn:
            prepared = conn.execute(text("SELECT statement FROM pg_prepared_statements")).scalars().all()
    assert not any("+" in statement for statement in prepared), prepared


def test_a_statement_first_met_inside_a_transaction_is_prepared_at_the_next_one(pg_url: str) -> None:
    touch = text("UPDATE llm_requests SET purpose = :p WHERE id = 1")
    with daemon_store(pg_url, queued=2) as store:
        with transaction(store.engine, store.dialect) as conn:
            conn.execute(text("SELECT 1"))  # the transaction has begun: no PREPARE may go now
            store.dialect.run_all(conn, [(touch, {"p": "first"})])
            assert "purpose" not in " ".join(_prepared_texts(conn))
        with transaction(store.engine, store.dialect) as conn:
            store.dialect.run_all(conn, [(touch, {"p": "second"})])
            assert "purpose" in " ".join(_prepared_texts(conn))
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT purpose FROM llm_requests WHERE id = 1")).scalar_one() == "second"


def test_a_session_whose_prepared_statements_were_cleared_prepares_them_again_and_the_commit_goes_on(
    pg_url: str,
) -> None:
    """Something clears a daemon session's prepared statements (a pooler resetting the session,
    an operator's `DISCARD ALL`): the group commit that meets the loss fails, that session is
    dropped, and the lane runs the group commit again, once, on a new session that prepares
    afresh."""
    with daemon_store(pg_url, queued=16) as store:
        first = _group_commit(store)()
        second = _group_commit(store, first.claim.requests)()  # prepares what the first met inside
        cleared: list[int] = []

        @event.listens_for(store.engine, "checkout")
        def _clear_once(dbapi_conn: Any, *_: Any) -> None:
            if not cleared:  # the session the next transaction runs in
                dbapi_conn.execute("DEALLOCATE ALL")
                cleared.append(dbapi_conn.info.backend_pid)

        calls: list[int] = []

        def group_commit() -> Any:
            calls.append(1)
            return _group_commit(store, second.claim.requests)()

        third = anyio.run(DbLane(retry_seconds=10).run, group_commit)
        event.remove(store.engine, "checkout", _clear_once)
        assert cleared and third.written == [Written.APPLIED] * 4 and len(calls) == 2
        assert _group_commit(store, third.claim.requests)().written == [Written.APPLIED] * 4
        with store.engine.connect() as conn:
            assert len(_prepared_texts(conn)) >= 8


def _prepared_texts(conn: Any) -> list[str]:
    return list(conn.execute(text("SELECT statement FROM pg_prepared_statements")).scalars())


def test_postgresql_still_prepares_what_sqlalchemy_repeats_between_hot_queries(pg_url: str) -> None:
    """The hot statements' query text is made once (its values are in it) and skips the driver's
    bookkeeping of texts to prepare; that bookkeeping is the connection's, and is back on
    after them, even when the server refuses one: the statements SQLAlchemy repeats (lease
    renewals in a store that is not a daemon's) are still prepared after their fifth run."""
    store = Store(pg_url)
    try:
        add_requests(store, 2)
        with transaction(store.engine, store.dialect) as conn:
            raw: Any = conn.connection.driver_connection
            threshold = raw.prepare_threshold
            with pytest.raises(DBAPIError), conn.begin_nested():
                store.dialect.run_all(conn, [(text("SELECT no_such_column FROM llm_requests"), {})])
            assert raw.prepare_threshold == threshold
            repeated = text("SELECT count(*) FROM llm_requests WHERE id = :id")
            for i in range(threshold + 1):
                conn.execute(repeated, {"id": i})
                store.dialect.run_all(
                    conn, [(text("UPDATE llm_requests SET purpose = :p WHERE id = 1"), {"p": f"x{i}"})]
                )
            assert raw.prepare_threshold == threshold
            prepared = conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars().all()
            assert any("llm_requests" in statement and "count" in statement for statement in prepared), prepared
    finally:
        store.close()


def test_a_rollback_in_a_daemon_s_session_leaves_its_prepared_statements_in_place(pg_url: str) -> None:
    """The driver, once it has prepared statements of its own, clears all of a session's after
    a rollback (ours too): in a daemon's session it prepares none, so a statement SQLAlchemy
    repeats and a transaction rolled back leave the group commit's prepared statements usable."""
    repeated = text("SELECT count(*) FROM llm_requests WHERE id = :id")
    with daemon_store(pg_url, queued=16) as store:
        recorded = _group_commit(store)()
        for i in range(8):  # past the driver's threshold for preparing a statement
            with transaction(store.engine, store.dialect) as conn:
                conn.execute(repeated, {"id": i})
        with pytest.raises(_Boom), transaction(store.engine, store.dialect) as conn:
            conn.execute(repeated, {"id": 0})
            raise _Boom
        again = _group_commit(store, recorded.claim.requests)()
        assert again.written == [Written.APPLIED] * 4 and again.claim is not None
        assert _group_commit(store, again.claim.requests)().written == [Written.APPLIED] * 4
        with store.engine.connect() as conn:
            names = conn.execute(text("SELECT name FROM pg_prepared_statements")).scalars().all()
    assert names and all(name.startswith("ledger_hot_") for name in names), names


def test_a_read_on_sqlite_does_not_wait_for_a_writer(sqlite_url: str) -> None:
    """Under WAL a reader takes no lock: `ledger status`, the metrics' reads and an enqueue's look
    for daemons go on while a daemon (here: another connection) holds the file's write lock, and
    see its last commit."""
    with daemon_store(sqlite_url, queued=3) as store:
        writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("UPDATE llm_requests SET purpose = 'uncommitted'")
            counts: list[dict[str, int]] = []
            reader = threading.Thread(target=lambda: counts.append(store.status_counts()), daemon=True)
            reader.start()
            reader.join(timeout=10)  # the store's busy timeout is 30 s: a read waiting for the lock is still here
            assert counts and counts[0]["queued"] == 3
        finally:
            writer.rollback()
            writer.close()
