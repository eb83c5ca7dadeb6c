"""Per-connection set-up of the store's engine: what each database's connections are told
as they open, and how their transactions begin.

Split from `dialect.py`: this runs once, when the engine is made (`schema.py`); the
`Dialect` it returns is what the store consults on every statement after.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from ledger.store.checkpoints import WAL_BACKSTOP_PAGES
from ledger.store.dialect import READ_ONLY, Dialect
from ledger.store.driver_runs import BEGIN_DUE
from ledger.store.prepared import keep_hot_statements


def configure_engine(
    engine: Engine,
    idle_in_transaction_s: float | None = None,
    background_checkpoints: bool = False,
    prepared_hot_statements: bool = False,
) -> Dialect:
    """Per-connection set-up; returns the dialect seam for this engine.

    `background_checkpoints` (SQLite; the daemon sets it): the engine's commits leave the WAL to a
    thread (`Dialect.checkpoints`), up to a backstop (`checkpoints.WAL_BACKSTOP_PAGES`).

    `idle_in_transaction_s` (PostgreSQL; the daemon sets it): the server ends a session of
    ours that sits inside a transaction doing nothing for that long, e.g. a daemon frozen
    while it holds a turn (a pool's, the ledger's), so the other daemons carry on instead of waiting for
    the freeze to end (the server's own default is to wait forever). SQLite has no such
    bound: a writer frozen inside its transaction holds the file's only write lock, and
    the others wait for it (up to their busy timeout, then their lane's retries).

    `prepared_hot_statements` (PostgreSQL; the daemon sets it): each session keeps the hot
    statements prepared (`prepared.keep_hot_statements`).
    """
    name = engine.dialect.name
    if name == "postgresql" and idle_in_transaction_s:
        _bound_idle_in_transaction(engine, max(1, int(idle_in_transaction_s * 1000)))
    if name == "sqlite":
        _sqlite_connections(engine, background_checkpoints)
    elif name == "postgresql":
        _pg_begins_with_first_statement(engine)
        if prepared_hot_statements:
            event.listen(engine, "connect", lambda dbapi_conn, _record: keep_hot_statements(dbapi_conn))
    else:
        raise ValueError(f"LEDGER_DATABASE_URL: unsupported database {name!r} (use sqlite or postgresql)")
    return Dialect(name)


def _bound_idle_in_transaction(engine: Engine, bound_ms: int) -> None:
    """PostgreSQL: each session's `idle_in_transaction_session_timeout`, set as it connects."""

    @event.listens_for(engine, "connect")
    def _pg_bound_idle(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"SET idle_in_transaction_session_timeout = {bound_ms}")
        dbapi_conn.commit()


def _sqlite_connections(engine: Engine, background_checkpoints: bool) -> None:
    """SQLite: WAL and its pragmas on each connection, and transactions begun by the store."""

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN below decide transactions, not the driver.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        # WAL: readers (the audit CLI) never block the daemon's writer.
        cur.execute("PRAGMA journal_mode=WAL")
        # NORMAL under WAL survives a killed process; only power loss can
        # drop the last commits. Documented in docs/decisions.md.
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        if background_checkpoints:  # the thread does it (`checkpoints.py`); this is the backstop
            cur.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front: two daemons on one file
        # serialise their claims instead of deadlocking on lock upgrade. A read
        # (`commit.reading`) begins deferred: under WAL it takes no lock, so it
        # neither waits for a writer nor holds one up.
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")


def _pg_begins_with_first_statement(engine: Engine) -> None:
    """PostgreSQL: a transaction's BEGIN sent with its first statement, not as a round trip of its own."""

    @event.listens_for(engine, "checkout")
    def _pg_begin_ourselves(dbapi_conn: Any, *_: Any) -> None:
        # The driver would send a transaction's BEGIN as a round trip of its own; the
        # store sends it itself, with the transaction's first statement (`driver_runs.in_one_query`).
        # At each checkout: SQLAlchemy, which takes the driver's transactions for its own,
        # would set the mode back after a connection ran at another isolation level.
        if not dbapi_conn.autocommit:
            dbapi_conn.autocommit = True

    @event.listens_for(engine, "begin")
    def _pg_begin_later(conn: Connection) -> None:
        conn.info[BEGIN_DUE] = True

    @event.listens_for(engine, "before_cursor_execute")
    def _pg_begin_first(conn: Connection, cursor: Any, *_: Any) -> None:
        if conn.info.pop(BEGIN_DUE, False):
            cursor.execute("BEGIN")

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _pg_begun_no_more(conn: Connection) -> None:
        if not conn.invalidated:  # (an invalidated connection's `info` cannot be read; it is gone)
            conn.info.pop(BEGIN_DUE, None)
