"""Rows handed to one statement as a table (`bound_rows`), on both databases: a group commit's
outcomes, a claim's picks, a chunk of batch results. PostgreSQL reads them from one JSON
parameter; SQLite from a VALUES list of bound values, or from JSON past the driver's limit on
bound values in one statement."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Integer,
    MetaData,
    Table,
    Text,
    bindparam,
    column,
    event,
    select,
    update,
)

from ledger.store import Store
from ledger.store.commit import transaction
from ledger.store.row_sets import bound_rows
from ledger.store.rows import Completed, Outcome, Written
from tests.integration.store_helpers import daemon_store

_COLUMNS = (column("id", BigInteger), column("text", Text), column("n", Integer), column("x", Float))
_SET = bound_rows("v", "b_set", *_COLUMNS)
# Plain parameters on both sides of the set, so that their order around it is checked too.
_READ = (
    select(bindparam("b_before"), _SET.c.id, _SET.c.text, _SET.c.n, _SET.c.x, bindparam("b_after"))
    .select_from(_SET)
    .order_by(_SET.c.id)
)
_ROWS: list[dict[str, Any]] = [
    {"id": 1, "text": "plain", "n": 7, "x": 0.25},
    {"id": 2, "text": 'it\'s "quoted", with a ? and a comma', "n": None, "x": -1.5},
    {"id": 3, "text": "non-ASCII: été, 日本, 🙂", "n": 0},  # x left out: NULL
    {"id": 4, "text": None, "n": 2**31 - 1, "x": 1e-9},
]


# A table of the test's own, written from a set whose rows each reach one row of it.
_TABLE = Table(
    "t_pieces",
    MetaData(),
    Column("id", BigInteger, primary_key=True),
    Column("text", Text),
    Column("n", Integer),
    Column("x", Float),
)
_t = _TABLE.c
_WRITE = (
    update(_TABLE)
    .where(_t.id == _SET.c.id, _t.n.is_(None))
    .values(text=_SET.c.text, n=_SET.c.n, x=_SET.c.x)
    .returning(_t.id, _t.text)
)


def _read(store: Store, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    with transaction(store.engine, store.dialect) as conn:
        (found,) = store.dialect.run_all(conn, [(_READ, {**_SET.bind(rows), "b_before": "<", "b_after": ">"})])
    return [tuple(row) for row in found.rows]


def _expected(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [("<", r["id"], r.get("text"), r.get("n"), r.get("x"), ">") for r in rows]


def _lower_sqlite_value_limit(store: Store, limit: int) -> list[str]:
    """New connections of `store` bind at most `limit` values a statement (as SQLite before 3.32
    did, 999); returns the statements they run, as SQLite traces them."""
    ran: list[str] = []

    def lower(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)
        dbapi_conn.set_trace_callback(ran.append)

    event.listen(store.engine, "connect", lower)
    store.engine.dispose()
    return ran


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with daemon_store(db_url) as s:
        yield s


def test_a_set_of_rows_reads_back_as_given_with_the_parameters_around_it_in_place(store: Store) -> None:
    assert _read(store, _ROWS) == _expected(_ROWS)
    assert _read(store, _ROWS[:1]) == _expected(_ROWS[:1])
    assert _read(store, []) == []  # an empty set is a table with no rows, not an error


def test_sqlite_reads_a_set_past_its_bound_value_limit_as_json_the_same(sqlite_url: str) -> None:
    """Five columns of 300 rows is 1,500 values: past SQLite's limit before 3.32 (999), the set
    goes as one JSON parameter, and reads back the same."""
    with daemon_store(sqlite_url) as store:
        ran = _lower_sqlite_value_limit(store, 999)
        many = [{"id": i, "text": f"row {i} ✓", "n": i * 3, "x": i / 8} for i in range(300)]
        assert _read(store, many) == _expected(many)
        assert any("json_each" in sql for sql in ran)
        ran.clear()
        assert _read(store, _ROWS) == _expected(_ROWS)
        assert any("FROM (VALUES (" in sql for sql in ran) and not any("json_each" in sql for sql in ran)


def test_sqlite_writes_a_group_commit_past_its_bound_value_limit_row_by_row_as_reported(sqlite_url: str) -> None:
    """A daemon with a high slot limit commits a group of hundreds of outcomes, 15 values each:
    past the driver's limit, every outcome still lands on its own row."""
    with daemon_store(sqlite_url, queued=80) as store:
        _lower_sqlite_value_limit(store, 999)
        limits = {"lease_seconds": 30, "global_limit": 80, "pool_limit": lambda _: 80, "max_attempts": 3}
        claimed = store.claim("w1", max_claims=80, **limits).requests
        assert len(claimed) == 80
        outcomes: list[Outcome] = [Completed(r, r.attempt, f"answer {r.id}", 10, r.id, 2 * r.id) for r in claimed]
        recorded = store.record(outcomes, claim_for="w1", max_claims=80, reclaim=False, **limits)
        assert recorded.written == [Written.APPLIED] * 80
        for r in claimed:
            row = store.get_request(r.id)
            assert row is not None and row["status"] == "completed"
            assert (row["raw_output"], row["input_tokens"], row["output_tokens"]) == (f"answer {r.id}", r.id, 2 * r.id)


def test_a_set_of_thousands_of_rows_each_acting_alone_writes_as_one_statement_would(db_url: str) -> None:
    """A chunk of batch results (thousands of rows, some columns empty in every row) written with
    `execute_by_rows`: SQLite runs it in VALUES pieces within its limit on bound values, PostgreSQL
    as one statement; either way every row lands, rowcount and RETURNING cover the whole set, and
    a row the statement's own condition excludes is left alone."""
    with daemon_store(db_url) as store:
        ran = _lower_sqlite_value_limit(store, 999) if store.dialect.name == "sqlite" else []
        _TABLE.create(store.engine)
        with transaction(store.engine, store.dialect) as conn:
            conn.execute(_TABLE.insert(), [{"id": i, "n": 1 if i == 7 else None} for i in range(2500)])
        rows = [{"id": i, "text": f"answer {i} ✓", "n": i * 3 if i % 2 else None} for i in range(2500)]  # x: never
        with transaction(store.engine, store.dialect) as conn:
            wrote = store.dialect.execute_by_rows(conn, _WRITE, _SET.bind(rows))
        assert wrote.rowcount == 2499  # row 7 had an `n`: not written
        assert sorted(wrote.rows) == [(i, f"answer {i} ✓") for i in range(2500) if i != 7]
        with transaction(store.engine, store.dialect) as conn:
            found = {row.id: tuple(row)[1:] for row in conn.execute(select(_TABLE))}
        assert found[7] == (None, 1, None)
        assert all(found[i] == (f"answer {i} ✓", i * 3 if i % 2 else None, None) for i in range(2500) if i != 7)
        if store.dialect.name == "sqlite":
            pieces = [sql for sql in ran if sql.startswith("UPDATE t_pieces")]
            assert len(pieces) > 1 and all("FROM (VALUES (" in sql for sql in pieces)
            assert all("NULL AS x" in sql for sql in pieces)  # empty in every row: not bound
