"""The one place where SQLite and PostgreSQL differ.

Everything else in the store is written once, in SQLAlchemy Core, against the
constructs defined here:

- `db_now()` / `db_now_plus(seconds)` / `db_today()`: the database clock. Timestamps never come
  from the process clock, so several hosts sharing one PostgreSQL agree on lease
  expiry and back-off deadlines. SQLite stores them as ISO text with microseconds
  so that plain string comparison orders them correctly.
- PostgreSQL's BEGIN, sent by the store with a transaction's first statement, not by the
  driver as a round trip of its own (`configure_engine`, `_in_one_query`).
- `Dialect.serialize_claimers()`: makes claim transactions run one at a time, so
  the in-flight count a claimer reads cannot be stale when it writes. PostgreSQL
  takes a transaction-scoped advisory lock; SQLite gets the same guarantee from
  `BEGIN IMMEDIATE` (its single writer), set up in `configure_engine`.
- `Dialect.for_update()`: `FOR UPDATE SKIP LOCKED` where it exists.
- `Dialect.bound_waits()`: a transaction that gives up waiting after a deadline
  (PostgreSQL's `lock_timeout` / `statement_timeout`).
- `unindexed(column)`: the column's value, which the planner may not search an index by.
- `bound_rows` (row_sets.py): rows passed as a table (`UPDATE ... FROM`, `INSERT ... SELECT`),
  so a group or a chunk of thousands of rows is one set-based statement: PostgreSQL's
  `json_to_recordset` of one JSON parameter, SQLite's `VALUES` of plain ones.
- `Dialect.insert_rows()`: many rows in one set-based insert that skips existing keys:
  PostgreSQL COPYs them into a temporary staging table and inserts from it, SQLite (in
  process, no round trips to save) takes one multi-row VALUES.
- `Dialect.enqueue_pacing()`: how a large enqueue shares the database with running daemons.
"""

from __future__ import annotations

import collections
import functools
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import Table, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.cursor import CursorResult
from sqlalchemy.exc import DatabaseError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.selectable import Select

from ledger.store.checkpoints import WAL_BACKSTOP_PAGES, WalCheckpoints
from ledger.store.row_sets import SQLITE_VALUES_AT_MOST, RowSet, RowSetType, as_json, pieces, sqlite_statement

# The portable SQL pieces (sql_pieces.py), named here too: every store module imports them from here.
from ledger.store.sql_pieces import (
    as_utc as as_utc,
)
from ledger.store.sql_pieces import (
    db_now as db_now,
)
from ledger.store.sql_pieces import (
    db_now_plus as db_now_plus,
)
from ledger.store.sql_pieces import (
    db_today as db_today,
)
from ledger.store.sql_pieces import (
    json_text as json_text,
)
from ledger.store.sql_pieces import (
    jsonb_text as jsonb_text,
)
from ledger.store.sql_pieces import (
    read_json as read_json,
)
from ledger.store.sql_pieces import (
    read_json_column as read_json_column,
)
from ledger.store.sql_pieces import (
    seconds_between as seconds_between,
)
from ledger.store.sql_pieces import (
    storable as storable,
)
from ledger.store.sql_pieces import (
    unindexed as unindexed,
)

# Where a transaction keeps its PostgreSQL transaction id (Connection.info) until it commits.
XID_KEY = "ledger_xid"
# An execution option of a connection that only reads (`commit.reading`): SQLite begins it deferred.
READ_ONLY = "ledger_read_only"


class CommitNotApplied(OperationalError):
    """A COMMIT whose answer was lost, and the server says the transaction did not commit: retry it."""


class CommitRerunnable(OperationalError):
    """A COMMIT whose answer was lost, of a transaction that gives the same end state however
    often it runs (`transaction(..., rerunnable=True)`): run it again."""


class CommitUnknown(DatabaseError):
    """A COMMIT whose answer was lost, and the server could not be asked in time: never retried."""


# Any stable 64-bit number: the advisory lock key that serialises claimers.
CLAIM_LOCK_KEY = 7_391_046_221
# The lock is per ledger: advisory locks are database-wide, and ledgers in different schemas
# of one database (tenants, test runs, benchmarks) must not queue behind each other's claims.
# Keyed by the table the claims write (its oid), not the search path, so every session on one
# ledger takes the same lock whatever its search_path says.
CLAIM_LOCK = f"hashtextextended(CAST(CAST('llm_requests' AS regclass) AS oid)::text, {CLAIM_LOCK_KEY})"


class Dialect:
    """What differs between the two databases, and nothing else."""

    name: str

    def __init__(self, name: str) -> None:
        self.name = name
        # Compiled hot statements (module-level constants, so `id` is a stable key).
        self._statements: dict[int, _Hot] = {}
        self._sqlite_max_values: int | None = None  # values a statement binds as VALUES (`sqlite_statement`)

    def serialize_claimers(self, conn: Connection, *then: tuple[Any, dict[str, Any]]) -> list[Ran]:
        """Take the claim lock, then run the hot statements `then` (see `run_all`) in the same
        round trip; returns their results. SQLite: BEGIN IMMEDIATE already holds the only write
        lock, and `then` runs as it is."""
        if self.name != "postgresql":
            return self.run_all(conn, then)
        # The transaction id comes back with the lock, for free: if the COMMIT's answer is
        # lost, `commit.transaction` asks the server what became of it (`transaction_committed`).
        lock, *results = self.run_all(conn, [(_CLAIM_LOCK, {}), *then])
        conn.info[XID_KEY] = lock.rows[0][1]
        return results

    def serialize_cache(self, conn: Connection) -> None:
        """Take the response cache's lock until commit (`ledger.store.cache.resolve`): an enqueue
        resolving its new requests sees every enqueue that resolved before it. SQLite: BEGIN
        IMMEDIATE already holds the only write lock."""
        if self.name == "postgresql":
            conn.execute(_CACHE_LOCK)

    def run_all(self, conn: Connection, statements: Iterable[tuple[Any, dict[str, Any]]]) -> list[Ran]:
        """Hot statements (as `execute`) none of whose parameters depends on another's result,
        each result read whole. PostgreSQL gets them all in one round trip (`_in_one_query`),
        unless their parameters are large (long outputs): bound on the client, those would be
        copied into the query text and parsed there, which costs more than the round trips
        saved. Either way PostgreSQL plans them with `_PLANS_BY_KEY`, set back after them.
        SQLite runs them one after the other on the driver's cursor (`_one_by_one`)."""
        if not conn.in_transaction():  # as SQLAlchemy's own `execute` would: begin one
            conn.begin()
        driver_args = [self._driver_args(conn, stmt, params) for stmt, params in statements]
        if self.name != "postgresql":
            return _one_by_one(conn, driver_args)
        if _size(driver_args) > INLINE_AT_MOST:
            conn.exec_driver_sql(_PLANS_BY_KEY).close()  # a row of settings: nothing to read
            found = [Ran.read(conn.exec_driver_sql(sql, args)) for sql, args in driver_args]
            conn.exec_driver_sql(_PLANS_AS_USUAL).close()
            return found
        return _in_one_query(conn, driver_args)

    def update_then_insert(
        self,
        conn: Connection,
        together: Any,
        update: tuple[Any, dict[str, Any]],
        insert_for: Callable[[list[Any]], tuple[Any, dict[str, Any]]],
    ) -> list[Any]:
        """An UPDATE ... RETURNING and the rows inserted from what it returned; returns its rows.

        PostgreSQL runs `together` (the two as one statement, a data-modifying CTE): a round
        trip fewer on the claim's path. SQLite has no writes in CTEs, and no round trips to
        save: it runs the update, then `insert_for(rows)`'s statement with its parameters. All
        go through `run_all` (on PostgreSQL, its plans by key): what they return is not
        type-processed.
        """
        if self.name == "postgresql":
            (took,) = self.run_all(conn, [(together, update[1])])
            return took.rows
        (updated,) = self.run_all(conn, [update])
        if updated.rows:
            self.run_all(conn, [insert_for(updated.rows)])
        return updated.rows

    def as_one(self, combined: Any, parts: Sequence[Any]) -> list[Any]:
        """Statements that PostgreSQL runs as one (`combined`, data-modifying CTEs: a round trip
        fewer) and SQLite one after the other (`parts`, in order)."""
        return [combined] if self.name == "postgresql" else list(parts)

    def checkpoints(self, engine: Engine) -> WalCheckpoints | None:
        """SQLite: the thread that copies the WAL back into the database file after the engine's
        commits (`checkpoints.py`; the engine configured with `background_checkpoints`).
        PostgreSQL's own checkpointer process does that: None."""
        return WalCheckpoints(engine) if self.name == "sqlite" else None

    def learn_transaction_id(self, conn: Connection) -> None:
        """PostgreSQL: keep this transaction's id, as the claim lock's statement does, so that a lost
        COMMIT can be resolved (`commit.transaction`). SQLite has no connection to lose."""
        if self.name == "postgresql":
            conn.info[XID_KEY] = conn.exec_driver_sql(f"SELECT {_XID}").scalar_one()

    def transaction_status(self, conn: Connection, xid: str) -> str | None:
        """'committed', 'aborted' or 'in progress' (PostgreSQL; asked on a new connection after a
        lost COMMIT); None when the server no longer knows the transaction."""
        status = conn.execute(text("SELECT pg_xact_status(CAST(:xid AS xid8))"), {"xid": xid}).scalar_one()
        return None if status is None else str(status)

    def bound_waits(self, conn: Connection, seconds: float) -> None:
        """Give up this transaction's lock waits and statements after `seconds`. PostgreSQL:
        transaction-local `lock_timeout` and `statement_timeout`; SQLite's single lock wait is
        its connection's busy timeout, left as it is."""
        if self.name == "postgresql":
            ms = str(max(1, int(seconds * 1000)))
            conn.execute(
                text("SELECT set_config('lock_timeout', :ms, true), set_config('statement_timeout', :ms, true)"),
                {"ms": ms},
            )

    def refresh_statistics(self, conn: Connection, table: Table) -> None:
        """PostgreSQL: ANALYZE `table` after a write that changed much of it. Until autovacuum
        gets to it, its planner would take a table just filled for one of a few rows and scan
        it once per row of a `bound_rows` set. SQLite's plans for these statements do not
        depend on statistics."""
        if self.name == "postgresql":
            conn.exec_driver_sql(f"ANALYZE {table.name}")

    def insert_ignore(self, table: Table, conflict_columns: list[str]) -> Insert:
        """INSERT that silently skips rows whose unique key already exists (idempotency)."""
        module = postgresql if self.name == "postgresql" else sqlite
        stmt: Insert = module.insert(table).on_conflict_do_nothing(index_elements=conflict_columns)
        return stmt

    def upsert(
        self,
        table: Table,
        conflict_columns: list[str],
        values: dict[str, Any],
        updates: dict[str, Any],
        on_conflict: dict[str, Any] | None = None,
    ) -> Insert:
        """INSERT `values` + `updates`; on a key conflict, SET `updates` (+ `on_conflict`,
        expressions over the existing row, evaluated under its row lock)."""
        module = postgresql if self.name == "postgresql" else sqlite
        stmt: Insert = (
            module.insert(table)
            .values(**values, **updates)
            .on_conflict_do_update(index_elements=conflict_columns, set_={**updates, **(on_conflict or {})})
        )
        return stmt

    def execute(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> CursorResult[*tuple[Any, ...]]:
        """Run a hot statement, compiled once per engine, with `params` handed to the driver as
        they are (SQLAlchemy's parameter processing skipped). Only for plain values (str,
        int, float, None) and `RowSet`s (`bound_rows`), which need no type processing."""
        return conn.exec_driver_sql(*self._driver_args(conn, stmt, params))

    def execute_by_rows(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> Ran:
        """`execute` for a statement whose one set's rows each act alone (an UPDATE ... FROM the
        set WHERE key = its id): its rows and rowcount. SQLite runs a set too large for one VALUES
        list in pieces that fit one (`pieces`): as one JSON set, every column of every row was a
        `json_extract`, 15 us a row of a batch's result chunk, a third of the mapping's writes
        (pieces of up to `SQLITE_VALUES_AT_MOST` values: four times as many were slower, 15,100-
        17,000 requests/s mapped against 19,500-21,000). PostgreSQL parses one JSON set in one go,
        and runs it once."""
        hot = self._compiled(conn, stmt)
        if hot.names is None:
            result = self.execute(conn, stmt, params)
            rowcount = result.rowcount  # psycopg's, known at once: gone once the rows are read
            return Ran(list(result) if result.returns_rows else [], rowcount)
        (name,) = hot.row_params
        whole: RowSet = params[name]
        fit = max(1, (self._max_values(conn) - len(hot.names) + 1) // len(whole.bound_columns))
        ran = [Ran.read(self.execute(conn, stmt, params | {name: part})) for part in pieces(whole, fit)]
        return Ran([row for each in ran for row in each.rows], sum(each.rowcount for each in ran))

    def _driver_args(self, conn: Connection, stmt: Any, params: dict[str, Any]) -> tuple[str, Any]:
        hot = self._compiled(conn, stmt)
        values = {**hot.defaults, **params}
        if hot.names is None:  # PostgreSQL: named parameters
            return hot.sql, as_json(values, hot.row_params) if hot.row_params else values
        if hot.row_params:
            return sqlite_statement(hot.sql, hot.names, hot.row_params, values, self._max_values(conn))
        return hot.sql, tuple(values[n] for n in hot.names)

    def _max_values(self, conn: Connection) -> int:
        """SQLite: the values a statement binds as VALUES before its sets go as JSON."""
        if self._sqlite_max_values is None:
            self._sqlite_max_values = min(_sqlite_max_variables(conn), SQLITE_VALUES_AT_MOST)
        return self._sqlite_max_values

    def execute_many(self, conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> CursorResult[*tuple[Any, ...]]:
        """`execute` for many parameter sets at once (the driver's executemany); same rules, but
        no `RowSet`s (a set is already many rows in one statement)."""
        hot = self._compiled(conn, stmt)
        assert not hot.row_params, "a statement with bound rows runs once per set (`execute`)"
        if hot.names is None:
            return conn.exec_driver_sql(hot.sql, [{**hot.defaults, **row} for row in rows])
        merged = ({**hot.defaults, **row} for row in rows)
        return conn.exec_driver_sql(hot.sql, [tuple(values[n] for n in hot.names) for values in merged])

    def _compiled(self, conn: Connection, stmt: Any) -> _Hot:
        key = id(stmt)
        found = self._statements.get(key)
        if found is None:
            compiled = stmt.compile(dialect=conn.dialect)
            binds = compiled.binds.items()
            found = self._statements[key] = _Hot(
                str(compiled),
                tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None,
                {name: bind.effective_value for name, bind in binds if not bind.required},
                frozenset(name for name, bind in binds if isinstance(bind.type, RowSetType)),
            )
        return found

    def insert_rows(
        self,
        conn: Connection,
        table: Table,
        columns: tuple[str, ...],
        rows: list[tuple[Any, ...]],
        *,
        key: str,
        clock: tuple[str, ...] = ("created_at", "updated_at", "next_attempt_at"),
    ) -> list[tuple[int, str]]:
        """INSERT `rows` (tuples in `columns` order, JSON columns as JSON text) with the `clock`
        columns set to the database's now, skipping rows whose `key` exists; returns (id, key)
        of each row inserted. One statement per chunk, not one per row."""
        if not rows:
            return []
        now = str(db_now().compile(dialect=conn.dialect))
        into = f"INSERT INTO {table.name} ({', '.join([*columns, *clock])})"
        skip = f"ON CONFLICT ({key}) DO NOTHING RETURNING id, {key}"
        if self.name == "postgresql":
            stage = f"ledger_stage_{table.name}"
            picked = f"SELECT {', '.join([*columns, *[now] * len(clock)])} FROM {stage} ORDER BY ord"
            return _copy_then_insert(conn, table, stage, columns, rows, f"{into} {picked} {skip}")
        per_statement = max(1, _sqlite_max_variables(conn) // len(columns))
        group = "(" + ", ".join(["?"] * len(columns) + [now] * len(clock)) + ")"
        new: list[tuple[int, str]] = []
        for i in range(0, len(rows), per_statement):
            part = rows[i : i + per_statement]
            sql = f"{into} VALUES {', '.join([group] * len(part))} {skip}"
            flat = tuple(value for row in part for value in row)
            new.extend((int(r[0]), str(r[1])) for r in conn.exec_driver_sql(sql, flat).all())
        return new

    def enqueue_pacing(self) -> tuple[int, float]:
        """Rows per transaction of an enqueue, and the share of its time it may spend inside them.

        SQLite has one write lock per file: a daemon's claim or record waits while an enqueue
        holds it. Short chunks bound that wait, and a pause after each (as long as the chunk
        took: half the time) lets a waiting daemon in; without it SQLite's busy handler, which
        polls ever less often, could lose the lock to the next chunk again and again. (The pause
        is taken only while a daemon was heard from: `ledger.intake`.) PostgreSQL locks rows,
        not the database: bigger chunks, no pause.
        """
        if self.name == "postgresql":
            return 5000, 1.0
        return 1000, 0.5

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        if self.name == "postgresql":
            return stmt.with_for_update(skip_locked=True)
        return stmt


# The transaction's id as `XID_KEY` keeps it (`commit.transaction` asks about it after a lost COMMIT).
_XID = "pg_current_xact_id()::text"
_CLAIM_LOCK = text(f"SELECT pg_advisory_xact_lock({CLAIM_LOCK}), {_XID}")
_CACHE_LOCK = text(f"SELECT pg_advisory_xact_lock({CLAIM_LOCK_KEY} + 1)")


@dataclass(frozen=True)
class _Hot:
    """A hot statement as compiled for one engine: its SQL, its parameters' names in order
    (positional drivers; None for named ones), their defaults, and which of them are `RowSet`s."""

    sql: str
    names: tuple[str, ...] | None
    defaults: dict[str, Any]
    row_params: frozenset[str]


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
# statement of a query is a result the driver reads in Python (`_in_one_query`).
_PLANNER_SETTINGS = {"enable_nestloop": "off", "enable_bitmapscan": "off", "enable_seqscan": "off", "jit": "off"}
_PLANS_BY_KEY = "SELECT " + ", ".join(f"set_config('{k}', '{v}', true) AS {k}" for k, v in _PLANNER_SETTINGS.items())
_PLANS_AS_USUAL = "SELECT " + ", ".join(f"set_config('{k}', NULL, true) AS {k}" for k in _PLANNER_SETTINGS)


def _size(driver_args: list[tuple[str, Any]]) -> int:
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


def _in_one_query(conn: Connection, statements: list[tuple[str, Any]]) -> list[Ran]:
    """PostgreSQL: `statements` as one simple query, one round trip, their results read in turn.

    Parameters are bound on the client (psycopg's `ClientCursor.mogrify`): the simple query
    protocol takes several statements at once but no parameters. The transaction's BEGIN goes
    in the same query when nothing was sent before it. Not psycopg's pipeline
    mode: it ends with a Flush after its Sync, and a server that reads a Flush last stops
    timing the session's idleness in a transaction, so a daemon frozen after it would hold the
    claim lock past `idle_in_transaction_session_timeout`.

    Outside SQLAlchemy's `execute` (which reads one result), so its error handling is done
    here as SQLAlchemy does it: a driver error comes out as SQLAlchemy's wrapped error, and
    a lost connection invalidates the connection and the pool, so that the lane's retry
    rules (`is_transient`) see what they always saw. (SQLAlchemy's `handle_error` and
    cursor events do not fire for these statements; the store registers none.)
    """
    raw: Any = conn.connection.driver_connection
    binder = psycopg.ClientCursor(raw)
    bound = [binder.mogrify(sql, args) for sql, args in statements]
    # The transaction's BEGIN, if nothing was sent in it yet: one round trip where the driver
    # would make two (see `configure_engine`).
    began = conn.info.pop(_BEGIN_DUE, False)
    first = ["BEGIN", _PLANS_BY_KEY] if began else [_PLANS_BY_KEY]
    query = ";\n".join([*first, *bound, _PLANS_AS_USUAL])
    # A query text made once (its values are in it, and it has several statements) is never
    # prepared: the driver's bookkeeping of texts to prepare (a key hashed over the whole text,
    # a cache looked up and updated) is skipped for it, and set back after it for the
    # statements SQLAlchemy repeats.
    prepare_threshold, raw.prepare_threshold = raw.prepare_threshold, None
    try:
        with raw.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(query)
            for _ in first:  # their results: nothing to read
                cursor.nextset()
            found = []
            for _ in statements:
                result = cursor.pgresult
                rows = cursor.fetchall() if result is not None and result.status == _TUPLES_OK else []
                found.append(Ran(rows, cursor.rowcount))
                cursor.nextset()
            return found
    except psycopg.Error as exc:
        error: Any = exc
        lost = conn.dialect.is_disconnect(error, raw, None)
        if lost:  # as SQLAlchemy does: every pooled connection of that server is suspect now
            conn.engine.pool._invalidate(conn.connection, exc)
            conn.invalidate(exc)
        elif began and raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.info[_BEGIN_DUE] = True  # refused whole (BEGIN too): the transaction is still to begin
        raise DBAPIError.instance(
            query, None, exc, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect
        ) from exc
    finally:
        raw.prepare_threshold = prepare_threshold


def _one_by_one(conn: Connection, statements: list[tuple[str, Any]]) -> list[Ran]:
    """SQLite: `statements` in turn on the driver's own cursor, each result read whole.

    SQLAlchemy's `exec_driver_sql` and its rows cost 15 us a statement more than the
    statement itself, a tenth of the lane's time in a group commit (issue 9). Errors come
    out wrapped as SQLAlchemy wraps them (see `_in_one_query`); a file has no connection
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
    """Rows as `_in_one_query` gives them (psycopg's `namedtuple_row`): by position or by name."""
    return collections.namedtuple("Row", names, rename=True)


def _copy_then_insert(
    conn: Connection, table: Table, stage: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]], insert: str
) -> list[tuple[int, str]]:
    """PostgreSQL: COPY `rows` into a temporary table (this session's, emptied at commit), then
    run `insert`, which selects from it in input order."""
    types = ", ".join(f"{c} {table.c[c].type.compile(dialect=conn.dialect)}" for c in columns)
    conn.exec_driver_sql(f"CREATE TEMP TABLE IF NOT EXISTS {stage} (ord integer, {types}) ON COMMIT DELETE ROWS")
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as cur:
        with cur.copy(f"COPY {stage} (ord, {', '.join(columns)}) FROM STDIN") as copy:
            for ord_, row in enumerate(rows):
                copy.write_row((ord_, *row))
        cur.execute(insert)
        return [(int(r[0]), str(r[1])) for r in cur.fetchall()]


def _sqlite_max_variables(conn: Connection) -> int:
    """SQLite's limit on bound parameters per statement (999 before 3.32, 32766 since)."""
    raw: Any = conn.connection.driver_connection
    return int(raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))


def is_transient(exc: BaseException) -> bool:
    """A database error worth trying the whole transaction again for.

    PostgreSQL: a lost or refused connection (a server restart, a terminated
    backend), a deadlock or serialization failure. SQLite: a locked database. Not:
    a missing table, a constraint violation, bad SQL (SQLite reports some of
    those as OperationalError too, hence the check of its message). And not a
    connection lost at COMMIT (no statement running, yet the connection dropped):
    the server may have committed, and a retry could apply the work twice, unless
    `commit.transaction` found out that it did not (`CommitNotApplied`).
    """
    if not isinstance(exc, DBAPIError):
        return False
    if isinstance(exc, CommitNotApplied | CommitRerunnable):  # a lost COMMIT that is safe to run again
        return True
    if exc.connection_invalidated:
        return exc.statement is not None
    if isinstance(exc.orig, sqlite3.OperationalError):
        return any(word in str(exc.orig) for word in ("locked", "busy"))
    return isinstance(exc, OperationalError | InterfaceError)


def configure_engine(
    engine: Engine, idle_in_transaction_s: float | None = None, background_checkpoints: bool = False
) -> Dialect:
    """Per-connection set-up; returns the dialect seam for this engine.

    `background_checkpoints` (SQLite; the daemon sets it): the engine's commits leave the WAL to a
    thread (`Dialect.checkpoints`), up to a backstop (`checkpoints.WAL_BACKSTOP_PAGES`).

    `idle_in_transaction_s` (PostgreSQL; the daemon sets it): the server ends a session of
    ours that sits inside a transaction doing nothing for that long, e.g. a daemon frozen
    while it holds the claim lock, so the other daemons carry on instead of waiting for
    the freeze to end (the server's own default is to wait forever). SQLite has no such
    bound: a writer frozen inside its transaction holds the file's only write lock, and
    the others wait for it (up to their busy timeout, then their lane's retries).
    """
    name = engine.dialect.name
    if name == "postgresql" and idle_in_transaction_s:
        bound_ms = max(1, int(idle_in_transaction_s * 1000))

        @event.listens_for(engine, "connect")
        def _pg_bound_idle(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute(f"SET idle_in_transaction_session_timeout = {bound_ms}")
            dbapi_conn.commit()

    if name == "sqlite":

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

    elif name == "postgresql":

        @event.listens_for(engine, "checkout")
        def _pg_begin_ourselves(dbapi_conn: Any, *_: Any) -> None:
            # The driver would send a transaction's BEGIN as a round trip of its own; the
            # store sends it itself, with the transaction's first statement (`_in_one_query`).
            # At each checkout: SQLAlchemy, which takes the driver's transactions for its own,
            # would set the mode back after a connection ran at another isolation level.
            if not dbapi_conn.autocommit:
                dbapi_conn.autocommit = True

        @event.listens_for(engine, "begin")
        def _pg_begin_later(conn: Connection) -> None:
            conn.info[_BEGIN_DUE] = True

        @event.listens_for(engine, "before_cursor_execute")
        def _pg_begin_first(conn: Connection, cursor: Any, *_: Any) -> None:
            if conn.info.pop(_BEGIN_DUE, False):
                cursor.execute("BEGIN")

        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _pg_begun_no_more(conn: Connection) -> None:
            if not conn.invalidated:  # (an invalidated connection's `info` cannot be read; it is gone)
                conn.info.pop(_BEGIN_DUE, None)

    else:
        raise ValueError(f"LEDGER_DATABASE_URL: unsupported database {name!r} (use sqlite or postgresql)")
    return Dialect(name)


# PostgreSQL: the transaction this connection began has sent nothing yet, not even its BEGIN.
_BEGIN_DUE = "ledger_begin_due"
