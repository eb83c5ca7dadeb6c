"""Statements run on the database driver itself, past SQLAlchemy's per-statement costs.

The store's hot paths (a claim, a group commit) run several statements a transaction, and
SQLAlchemy's `execute` costs more than the statement for most of them. `Dialect.run_all`
hands them here: PostgreSQL gets them in one simple query (`in_one_query`, one round trip,
with the planner settings they run under), SQLite one after the other on the driver's own
cursor (`one_by_one`). Also here: PostgreSQL's COPY into a staging table (`copy_then_insert`,
for `Dialect.insert_rows`) and SQLite's limit on bound parameters. Split from `dialect.py`,
which decides per database what runs; this module holds how it runs.
"""

from __future__ import annotations

import collections
import functools
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Table
from sqlalchemy.engine import Connection
from sqlalchemy.engine.cursor import CursorResult
from sqlalchemy.exc import DBAPIError, StatementError

from ledger.store.prepared import as_sent, session_was_reset

# PostgreSQL: the transaction this connection began has sent nothing yet, not even its BEGIN
# (set by `engine_setup.configure_engine`; the first statement sent, here or by SQLAlchemy, sends it).
BEGIN_DUE = "ledger_begin_due"


@dataclass(frozen=True)
class Ran:
    """A statement's result, read whole: its rows (by position or column name) and rowcount."""

    rows: list[Any]
    rowcount: int

    @classmethod
    def read(cls, result: CursorResult[*tuple[Any, ...]]) -> Ran:
        return cls(list(result) if result.returns_rows else [], result.rowcount)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)


# Parameter characters up to which `run_all` sends its statements as one query on PostgreSQL.
INLINE_AT_MOST = 64 * 1024
# The plans `run_all`'s statements get on PostgreSQL, whatever the planner estimates: each
# reaches rows by key, a JSON chunk joined to rows by primary key (a hash join: the planner,
# taking the fenced rows for one, rescanned the chunk once per row, 50 x 50 comparisons),
# or running rows by the in-flight index (a plain index scan, which marks the entries of
# rows no longer running dead: a bitmap scan never does, so until a vacuum every count of
# the running rows visited every request run since, 2.5 ms a group commit at 20,000), never
# by scanning a table an index reaches: a young ledger's attempts (some thousands, not
# analysed yet, each key taken for 1/200 of the table) were read whole to close fifty, 1.9 ms
# of a 7 ms group commit at 10,000, where the key lookups take 0.1. No JIT: a scan left with no other way
# (the pools, the live daemons: a few rows) is costed past JIT's threshold once scans are off,
# and compiling one took 24-370 ms.
# Transaction-local, and set back right after those statements: the transaction's others
# (a budget's OR of two indexes, say) keep their usual plans. "Back" is the server's and the
# connection's setting (`set_config` to NULL is `SET LOCAL ... TO DEFAULT`); the store sets
# neither at session level. One statement each way, not a `SET LOCAL` per setting: each
# statement of a query is a result the driver reads in Python (`in_one_query`).
_PLANNER_SETTINGS = {"enable_nestloop": "off", "enable_bitmapscan": "off", "enable_seqscan": "off", "jit": "off"}
PLANS_BY_KEY = "SELECT " + ", ".join(f"set_config('{k}', '{v}', true) AS {k}" for k, v in _PLANNER_SETTINGS.items())
PLANS_AS_USUAL = "SELECT " + ", ".join(f"set_config('{k}', NULL, true) AS {k}" for k in _PLANNER_SETTINGS)


def text_size(driver_args: list[tuple[str, Any]]) -> int:
    """The statements' text parameters' length in characters (a plain loop: this runs at every
    group commit)."""
    size = 0
    for _, args in driver_args:
        for value in args.values() if isinstance(args, dict) else args:
            if isinstance(value, str):
                size += len(value)
    return size


# A result with rows to read (a SELECT, a RETURNING); the others are command statuses only.
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def in_one_query(conn: Connection, statements: list[tuple[str, Any]]) -> list[Ran]:
    """PostgreSQL: `statements` as one simple query, one round trip, their results read in turn.

    Parameters are bound on the client (psycopg's `ClientCursor.mogrify`): the simple query
    protocol takes several statements at once but no parameters. The transaction's BEGIN goes
    in the same query when nothing was sent before it. Not psycopg's pipeline
    mode: it ends with a Flush after its Sync, and a server that reads a Flush last stops
    timing the session's idleness in a transaction, so a daemon frozen after it would hold the
    claim lock past `idle_in_transaction_session_timeout`.

    Outside SQLAlchemy's `execute` (which reads one result), so its error handling is done
    here as SQLAlchemy does it (`_as_sqlalchemy_error`). (SQLAlchemy's `handle_error` and
    cursor events do not fire for these statements; the store registers none.)
    """
    raw: Any = conn.connection.driver_connection
    # The transaction's BEGIN, if nothing was sent in it yet: one round trip where the driver
    # would make two (see `engine_setup.configure_engine`).
    began = conn.info.pop(BEGIN_DUE, False)
    first = ["BEGIN", PLANS_BY_KEY] if began else [PLANS_BY_KEY]
    query = ""
    # A query text made once (its values are in it, and it has several statements) is never
    # prepared: the driver's bookkeeping of texts to prepare (a key hashed over the whole text,
    # a cache looked up and updated) is skipped for it, and set back after it for the
    # statements SQLAlchemy repeats.
    prepare_threshold, raw.prepare_threshold = raw.prepare_threshold, None
    try:
        query = _one_query(raw, first, as_sent(raw, statements))
        with raw.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(query)
            for _ in first:  # their results: nothing to read
                cursor.nextset()
            return _read_results(cursor, len(statements))
    except psycopg.Error as exc:
        raise _as_sqlalchemy_error(conn, raw, exc, query, began=began) from exc
    finally:
        raw.prepare_threshold = prepare_threshold


def _one_query(raw: Any, first: list[str], statements: list[tuple[str, Any]]) -> str:
    """The query text: `first`, the statements with their parameters bound on the client (a
    statement the session has prepared as its EXECUTE: `prepared.as_sent`), and the planner's
    settings set back."""
    binder = psycopg.ClientCursor(raw)
    bound = [binder.mogrify(sql, args) for sql, args in statements]
    return ";\n".join([*first, *bound, PLANS_AS_USUAL])


def _read_results(cursor: Any, count: int) -> list[Ran]:
    """The next `count` results of the query, each read whole."""
    found = []
    for _ in range(count):
        result = cursor.pgresult
        rows = cursor.fetchall() if result is not None and result.status == _TUPLES_OK else []
        found.append(Ran(rows, cursor.rowcount))
        cursor.nextset()
    return found


def _as_sqlalchemy_error(conn: Connection, raw: Any, exc: psycopg.Error, query: str, *, began: bool) -> StatementError:
    """A driver error as SQLAlchemy's `execute` would have raised it: wrapped, and a lost
    connection invalidating the connection and the pool, so that the lane's retry rules
    (`is_transient`) see what they always saw. A session that lost what it had prepared
    (`prepared.session_was_reset`) is invalidated too, alone: the lane runs the transaction
    again on a new session, which prepares afresh and is set up as every new one is."""
    error: Any = exc
    lost = conn.dialect.is_disconnect(error, raw, None)
    if lost:  # as SQLAlchemy does: every pooled connection of that server is suspect now
        conn.engine.pool._invalidate(conn.connection, exc)
        conn.invalidate(exc)
    elif session_was_reset(exc):  # this session only: a new one starts clean, and the lane runs it again
        conn.invalidate(exc)
        lost = True
    elif began and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        conn.info[BEGIN_DUE] = True  # refused whole (BEGIN too): the transaction is still to begin
    return DBAPIError.instance(query, None, exc, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect)


def one_by_one(conn: Connection, statements: list[tuple[str, Any]]) -> list[Ran]:
    """SQLite: `statements` in turn on the driver's own cursor, each result read whole.

    SQLAlchemy's `exec_driver_sql` and its rows cost 15 us a statement more than the
    statement itself, a tenth of the lane's time in a group commit. Errors come
    out wrapped as SQLAlchemy wraps them (see `in_one_query`); a file has no connection
    to lose."""
    raw: Any = conn.connection.driver_connection
    cursor = raw.cursor()
    found = []
    sql, args = "", None
    try:
        for sql, args in statements:
            cursor.execute(sql, args)
            rows = cursor.fetchall() if cursor.description else []
            if rows:
                named = _row_type(tuple(d[0] for d in cursor.description))
                rows = [named._make(row) for row in rows]
            found.append(Ran(rows, cursor.rowcount))
        return found
    except sqlite3.Error as exc:
        raise DBAPIError.instance(sql, args, exc, sqlite3.Error, dialect=conn.dialect) from exc
    finally:
        cursor.close()


@functools.cache
def _row_type(names: tuple[str, ...]) -> Any:
    """Rows as `in_one_query` gives them (psycopg's `namedtuple_row`): by position or by name."""
    return collections.namedtuple("Row", names, rename=True)


def copy_then_insert(
    conn: Connection, table: Table, stage: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]], insert: str
) -> list[tuple[Any, ...]]:
    """PostgreSQL: COPY `rows` into a temporary table (this session's, emptied at commit), then
    run `insert`, which selects from it in input order.

    Without JIT: the planner costs the insert's lookup for each row (its source in the response
    cache) high enough to compile it, and compiling took 1.1 s of each 1.2 s chunk, where the
    statement itself runs in a tenth of a second."""
    types = ", ".join(f"{c} {table.c[c].type.compile(dialect=conn.dialect)}" for c in columns)
    conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {stage} (ord integer, {types}) ON COMMIT DELETE ROWS")
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as cur:
        with cur.copy(f"COPY {stage} (ord, {', '.join(columns)}) FROM STDIN") as copy:
            for ord_, row in enumerate(rows):
                copy.write_row((ord_, *row))
        cur.execute("SET LOCAL jit = off")
        cur.execute(insert)
        return [tuple(r) for r in cur.fetchall()]


def sqlite_max_variables(conn: Connection) -> int:
    """SQLite's limit on bound parameters per statement (999 before 3.32, 32766 since)."""
    raw: Any = conn.connection.driver_connection
    return int(raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
