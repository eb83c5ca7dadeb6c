"""The one place where SQLite and PostgreSQL differ.

Everything else in the store is written once, in SQLAlchemy Core, against the
constructs defined here:

- `db_now()` / `db_now_plus(seconds)` / `db_today()`: the database clock. Timestamps never come
  from the process clock, so several hosts sharing one PostgreSQL agree on lease
  expiry and back-off deadlines. SQLite stores them as ISO text with microseconds
  so that plain string comparison orders them correctly.
- PostgreSQL's BEGIN, sent by the store with a transaction's first statement, not by the
  driver as a round trip of its own (`engine_setup.configure_engine`, `driver_runs.in_one_query`).
- Turns (PostgreSQL's transaction-scoped advisory locks; SQLite's `BEGIN IMMEDIATE`, its single
  writer, set up in `engine_setup.configure_engine`, already gives every one of them):
  `Dialect.writer_turn()`, the ledger's turn shared (a claim, a group commit, a renewal: they
  never wait for each other there) and the daemon's own; `Dialect.serialize_claimers()`, the
  ledger's turn alone (the rare multi-row writers: cancel, jobs, provider batches); and
  `Dialect.take_turns()`, a pool's (one with an RPM / TPM cap or a provider's window: other
  pools keep their limits as slots, `slots.py`) or a job's (its own budget).
  Every transaction takes them in one order (ledger, worker, pools, jobs by name); one that would
  break it is only tried, never waited for, so advisory locks never deadlock
  (docs/architecture.md, "Claims without a ledger-wide lock").
- `Dialect.for_update()`: `FOR UPDATE SKIP LOCKED` where it exists.
- `Dialect.bound_waits()`: a transaction that gives up waiting after a deadline
  (PostgreSQL's `lock_timeout` / `statement_timeout`).
- `unindexed(column)`: the column's value, which the planner may not search an index by.
- `bound_rows` (row_sets.py): rows passed as a table (`UPDATE ... FROM`, `INSERT ... SELECT`),
  so a group or a chunk of thousands of rows is one set-based statement: PostgreSQL's
  `json_to_recordset` of one JSON parameter, SQLite's `VALUES` of plain ones.
- `Dialect.insert_rows()`: many rows in one set-based `INSERT ... SELECT`: PostgreSQL COPYs
  them into a temporary staging table and inserts from it, SQLite (in process, no round
  trips to save) reads them from a multi-row VALUES.
- `Dialect.enqueue_pacing()`: how a large enqueue shares the database with running daemons.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, text
from sqlalchemy import column as sql_column
from sqlalchemy import table as sql_table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.cursor import CursorResult
from sqlalchemy.exc import DatabaseError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.selectable import NamedFromClause, Select

from ledger.store.checkpoints import WalCheckpoints
from ledger.store.driver_runs import (
    INLINE_AT_MOST,
    PLANS_AS_USUAL,
    PLANS_BY_KEY,
    copy_then_insert,
    in_one_query,
    one_by_one,
    sqlite_max_variables,
    text_size,
)

# A hot statement's result read whole (driver_runs.py), named here too: the store reads it from here.
from ledger.store.driver_runs import (
    Ran as Ran,
)
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


# Rows per enqueue transaction when no daemon may be waiting for them (`Dialect.enqueue_pacing`).
ALONE_CHUNK_ROWS = 5000
# Rows per multi-row INSERT on SQLite. As many as its variables allow (over a thousand) made each
# prepared statement (kept in the driver's statement cache) cost megabytes: an enqueue's peak
# memory grew by a third; a few hundred rows cost no more time.
SQLITE_ROWS_PER_INSERT = 300
# Any stable 64-bit number: the advisory lock key that serialises claimers.
CLAIM_LOCK_KEY = 7_391_046_221
# The lock is per ledger: advisory locks are database-wide, and ledgers in different schemas
# of one database (tenants, test runs, benchmarks) must not queue behind each other's claims.
# Keyed by the table the claims write (its oid), not the search path, so every session on one
# ledger takes the same lock whatever its search_path says.
CLAIM_LOCK = f"hashtextextended(CAST(CAST('llm_requests' AS regclass) AS oid)::text, {CLAIM_LOCK_KEY})"
# A turn's key: the ledger's table oid and the turn (`Turn`) as text, hashed like `CLAIM_LOCK`.
TURN_LOCK = f"hashtextextended(CAST(CAST('llm_requests' AS regclass) AS oid)::text || :b_turn, {CLAIM_LOCK_KEY})"
# What turns are taken for, in the order every transaction takes them (`Turn` sorts by rank, then name).
LEDGER, WORKER, POOL, JOB = 0, 1, 2, 3
# A turn: (rank, name), e.g. (POOL, "openai:gpt-4o-mini").
Turn = tuple[int, str]
# Where a transaction keeps the turns it holds (Connection.info, with the transaction they belong to).
_TURNS_KEY = "ledger_turns"


class Dialect:
    """What differs between the two databases, and nothing else."""

    name: str

    def __init__(self, name: str) -> None:
        self.name = name
        # Compiled hot statements by `id` (module-level constants, mostly). Each entry holds its
        # statement: a statement made for one call (a test's `text(...)`) stays alive with it, so
        # its `id` is never another statement's.
        self._statements: dict[int, _Hot] = {}
        self._sqlite_max_values: int | None = None  # values a statement binds as VALUES (`sqlite_statement`)
        # PostgreSQL keeps the global limit as slots (`llm_slots`), taken by claims that run side by
        # side; SQLite's claims run one at a time (BEGIN IMMEDIATE), and their count is exact.
        self.keeps_slots = name == "postgresql"

    def serialize_claimers(self, conn: Connection, *then: tuple[Any, dict[str, Any]]) -> list[Ran]:
        """Take the ledger's turn alone (it waits for every claim, group commit and renewal in
        progress, which hold it shared, and they wait for it), then run the hot statements `then`
        (see `run_all`) in the same round trip; returns their results. For the rare writers of many
        rows that run beside the claims (cancel, a job's writes, a provider batch's), and for claims
        under a daily budget (spend is one figure for the whole ledger). SQLite: BEGIN IMMEDIATE
        already holds the only write lock, and `then` runs as it is."""
        return self._ledger_turn(conn, _CLAIM_LOCK, None, then)

    def writer_turn(
        self, conn: Connection, worker: str | None, *then: tuple[Any, dict[str, Any]], alone: bool = False
    ) -> list[Ran]:
        """The ledger's turn shared (`alone`: exclusive, as `serialize_claimers`) and `worker`'s
        own, first in the transaction, then `then` in the same round trip. Claims, group commits,
        renewals and releases take it: shared, they never wait for each other's; it keeps them
        out of the way of the rare writers that take the ledger's turn alone (both update many
        request rows, and would deadlock in the order they lock them). The worker's turn orders
        a daemon's own lanes (its main lane's records and claims, its renewals: the same rows);
        None: a writer that knows of no worker (a group commit that claims nothing) takes none."""
        return self._ledger_turn(conn, _CLAIM_LOCK if alone else _LEDGER_SHARED, worker, then)

    def _ledger_turn(
        self, conn: Connection, lock: Any, worker: str | None, then: Iterable[tuple[Any, dict[str, Any]]]
    ) -> list[Ran]:
        if self.name != "postgresql":
            return self.run_all(conn, then)
        mine = [(_TURN, {"b_turn": _turn_text((WORKER, worker))})] if worker is not None else []
        # The transaction id comes back with the lock, for free: if the COMMIT's answer is
        # lost, `commit.transaction` asks the server what became of it (`transaction_committed`).
        ran = self.run_all(conn, [(lock, {}), *mine, *then])
        conn.info[XID_KEY] = ran[0].rows[0][1]
        self._held(conn).update([(LEDGER, ""), *([(WORKER, worker)] if worker is not None else [])])
        return ran[1 + len(mine) :]

    def take_turns(
        self, conn: Connection, turns: Iterable[Turn], *then: tuple[Any, dict[str, Any]]
    ) -> tuple[set[Turn], list[Ran]]:
        """Take `turns` (pools' or jobs'), then run `then` in the same round trip, read after
        them; returns the turns this transaction now holds of those asked, and `then`'s results.

        Taken in (rank, name) order. A turn that sorts before one this transaction holds already
        is only tried (`pg_try_advisory_xact_lock`), never waited for: a wait only ever goes up
        the order, so no two transactions wait for each other's turns. A turn tried and found
        taken is left out of the answer: the caller leaves that pool (or job) alone this time.
        SQLite: every turn (BEGIN IMMEDIATE holds the only write lock)."""
        asked = set(turns)
        if self.name != "postgresql":
            return asked, self.run_all(conn, then)
        held = self._held(conn)
        top = max(held) if held else None
        locks: list[tuple[Any, dict[str, Any]]] = []
        new = sorted(asked - held)
        for turn in new:
            waits = top is None or turn > top
            locks.append((_TURN if waits else _TRY_TURN, {"b_turn": _turn_text(turn)}))
            top = turn if waits else top
        ran = self.run_all(conn, [*locks, *then])
        held |= {turn for turn, (lock, _), got in zip(new, locks, ran, strict=False) if lock is _TURN or got.rows[0][0]}
        return asked & held, ran[len(locks) :]

    def _held(self, conn: Connection) -> set[Turn]:
        """The turns this connection's transaction holds (a new transaction holds none)."""
        tx = conn.get_transaction()
        entry = conn.info.get(_TURNS_KEY)
        if entry is None or entry[0] is not tx:
            entry = conn.info[_TURNS_KEY] = (tx, set())
        held: set[Turn] = entry[1]
        return held

    def take_question_turns(self, conn: Connection, ids: list[int]) -> None:
        """Until commit, hold the turn of each question that the new requests `ids` ask while
        allowing the cache (`ledger.store.cache.resolve`): an enqueue resolving them sees every
        enqueue of the same questions that resolved before it, and waits for none that asks only
        other questions.

        PostgreSQL: each question's row in `llm_question_turns`, inserted or, when there, locked
        (`DO UPDATE ... WHERE false` updates nothing but locks the row it met), in key order so
        that two enqueues sharing several questions cannot deadlock. Row locks live in the rows,
        not in the server's shared lock table, so a chunk of thousands of questions needs no
        room there. SQLite: BEGIN IMMEDIATE already holds the only write lock."""
        if self.name == "postgresql" and ids:
            conn.execute(_QUESTION_TURNS, {"ids": ids})

    def run_all(self, conn: Connection, statements: Iterable[tuple[Any, dict[str, Any]]]) -> list[Ran]:
        """Hot statements (as `execute`) none of whose parameters depends on another's result,
        each result read whole. PostgreSQL gets them all in one round trip (`in_one_query`),
        unless their parameters are large (long outputs): bound on the client, those would be
        copied into the query text and parsed there, which costs more than the round trips
        saved. Either way PostgreSQL plans them with `PLANS_BY_KEY`, set back after them.
        SQLite runs them one after the other on the driver's cursor (`one_by_one`)."""
        if not conn.in_transaction():  # as SQLAlchemy's own `execute` would: begin one
            conn.begin()
        driver_args = [self._driver_args(conn, stmt, params) for stmt, params in statements]
        if self.name != "postgresql":
            return one_by_one(conn, driver_args)
        if text_size(driver_args) > INLINE_AT_MOST:
            conn.exec_driver_sql(PLANS_BY_KEY).close()  # a row of settings: nothing to read
            found = [Ran.read(conn.exec_driver_sql(sql, args)) for sql, args in driver_args]
            conn.exec_driver_sql(PLANS_AS_USUAL).close()
            return found
        return in_one_query(conn, driver_args)

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
        """PostgreSQL: keep this transaction's id, as the ledger's turn's statement does, so that a lost
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
            self._sqlite_max_values = min(sqlite_max_variables(conn), SQLITE_VALUES_AT_MOST)
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
                stmt,
            )
        return found

    def insert_rows(
        self,
        conn: Connection,
        table: Table,
        columns: tuple[str, ...],
        rows: list[tuple[Any, ...]],
        insert: Callable[[NamedFromClause], str],
    ) -> list[tuple[Any, ...]]:
        """Many rows (tuples in `columns` order, JSON columns as JSON text) inserted by one
        set-based statement per chunk, not one per row; returns what its RETURNING gives.

        `insert(s)` is that statement's text, an INSERT ... SELECT reading the rows from `s`, a
        table of `ord` (their order) and `columns`: PostgreSQL COPYs the rows into a temporary
        table and inserts from it; SQLite, in-process with no round trip to save, reads them
        from a VALUES list in front of the statement, a few hundred rows at a time."""
        if not rows:
            return []
        if self.name == "postgresql":
            stage = f"ledger_stage_{table.name}"
            relation = sql_table(stage, *[sql_column(c) for c in ("ord", *columns)]).alias("s")
            return copy_then_insert(conn, table, stage, columns, rows, insert(relation))
        relation = sql_table("s", *[sql_column(c) for c in ("ord", *columns)])
        statement = insert(relation)
        per_statement = min(SQLITE_ROWS_PER_INSERT, max(1, sqlite_max_variables(conn) // (len(columns) + 1)))
        group = "(" + ", ".join(["?"] * (len(columns) + 1)) + ")"
        found: list[tuple[Any, ...]] = []
        for i in range(0, len(rows), per_statement):
            part = rows[i : i + per_statement]
            values = f"WITH s (ord, {', '.join(columns)}) AS (VALUES {', '.join([group] * len(part))})"
            flat = tuple(value for at, row in enumerate(part, start=i) for value in (at, *row))
            found.extend(tuple(r) for r in conn.exec_driver_sql(f"{values} {statement}", flat).all())
        return found

    def enqueue_pacing(self, daemon_may_wait: bool = True) -> tuple[int, float]:
        """Rows per transaction of an enqueue, and the share of its time it may spend inside them.

        SQLite has one write lock per file: a daemon's claim or record waits while an enqueue
        holds it. Short chunks bound that wait, and a pause after each (as long as the chunk
        took: half the time) lets a waiting daemon in; without it SQLite's busy handler, which
        polls ever less often, could lose the lock to the next chunk again and again. (The pause
        is taken only while a daemon was heard from: `ledger.intake`.) PostgreSQL locks rows,
        not the database: bigger chunks, no pause. With no daemon heard from (`daemon_may_wait`
        False: loading a file before the work starts), nobody waits for the chunks on either
        database: chunks of `ALONE_CHUNK_ROWS`, five thousand rows a transaction.
        """
        if not daemon_may_wait:
            return ALONE_CHUNK_ROWS, 1.0
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
_QUESTION_TURNS = text(
    "INSERT INTO llm_question_turns (cache_key) SELECT DISTINCT cache_key FROM llm_requests"
    " WHERE id = ANY(CAST(:ids AS bigint[])) AND use_cache AND cache_key IS NOT NULL ORDER BY cache_key"
    " ON CONFLICT (cache_key) DO UPDATE SET cache_key = EXCLUDED.cache_key WHERE false"
)
_LEDGER_SHARED = text(f"SELECT pg_advisory_xact_lock_shared({CLAIM_LOCK}), {_XID}")
_TURN = text(f"SELECT pg_advisory_xact_lock({TURN_LOCK})")
_TRY_TURN = text(f"SELECT pg_try_advisory_xact_lock({TURN_LOCK})")


def _turn_text(turn: Turn) -> str:
    """A turn as the text its key hashes (after the table's oid): never the bare oid, the ledger's own."""
    return f"/{turn[0]}/{turn[1]}"


@dataclass(frozen=True)
class _Hot:
    """A hot statement as compiled for one engine: its SQL, its parameters' names in order
    (positional drivers; None for named ones), their defaults, and which of them are `RowSet`s."""

    sql: str
    names: tuple[str, ...] | None
    defaults: dict[str, Any]
    row_params: frozenset[str]
    statement: Any  # the statement itself, kept alive so that its `id` (the key) stays its own


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
