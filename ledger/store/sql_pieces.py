"""Portable SQL pieces the statements are built from: the database's clock, a column kept out of
the planner's index choice, JSON text as a JSON column's value, and text both databases store
alike. Each compiles once per dialect; `Dialect` (dialect.py) is what runs statements.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import expression
from sqlalchemy.sql.compiler import SQLCompiler

_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"


class db_now(expression.FunctionElement[Any]):
    """The database's current UTC time."""

    type = DateTime(timezone=True)
    inherit_cache = True


class db_now_plus(expression.FunctionElement[Any]):
    """The database's current UTC time plus a number of seconds (a bound float)."""

    type = DateTime(timezone=True)
    inherit_cache = True


class db_today(expression.FunctionElement[Any]):
    """The start of the database's current UTC day (daily budgets reset there)."""

    type = DateTime(timezone=True)
    inherit_cache = True


@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "clock_timestamp()"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return _SQLITE_NOW


@compiles(db_today, "postgresql")
def _pg_today(element: db_today, compiler: SQLCompiler, **kw: Any) -> str:
    return "date_trunc('day', clock_timestamp(), 'UTC')"


@compiles(db_today, "sqlite")
def _sqlite_today(element: db_today, compiler: SQLCompiler, **kw: Any) -> str:
    return "strftime('%Y-%m-%d 00:00:00.000', 'now') || '000'"


@compiles(db_now_plus, "postgresql")
def _pg_now_plus(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    return f"(clock_timestamp() + make_interval(secs => CAST({seconds} AS double precision)))"


@compiles(db_now_plus, "sqlite")
def _sqlite_now_plus(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(next(iter(element.clauses)), **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', CAST({seconds} AS REAL))) || '000'"


class unindexed(expression.FunctionElement[Any]):
    """A column's value, hidden from the planner's index choice (SQLite's unary `+`; on
    PostgreSQL `col || ''` or `col + 0`).

    For the checks a `bound_rows` join makes on each row it reaches by primary key: with
    no statistics yet (a table just filled) both planners would otherwise scan an index
    on such a check, `status = 'queued'` say, for every row it matches, and probe the
    chunk for each.
    """

    inherit_cache = True

    def __init__(self, col: expression.ColumnElement[Any]) -> None:
        super().__init__(col)
        self.type = col.type


@compiles(unindexed, "postgresql")
def _pg_unindexed(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    value = compiler.process(next(iter(element.clauses)), **kw)
    return f"({value} || '')" if isinstance(element.type, String) else f"({value} + 0)"


@compiles(unindexed, "sqlite")
def _sqlite_unindexed(element: unindexed, compiler: SQLCompiler, **kw: Any) -> str:
    return f"+{compiler.process(next(iter(element.clauses)), **kw)}"


class json_text(expression.FunctionElement[Any]):
    """A JSON document's text as the value of a JSON column: PostgreSQL casts it (to `json`, which
    keeps the text as written); SQLite stores JSON as its text already."""

    inherit_cache = True
    type = JSON()

    def __init__(self, col: expression.ColumnElement[Any]) -> None:
        super().__init__(col)


class jsonb_text(json_text):
    """`json_text` for a column PostgreSQL keeps as `jsonb` (queried inside)."""

    inherit_cache = True


@compiles(json_text, "postgresql")
def _pg_json_text(element: json_text, compiler: SQLCompiler, **kw: Any) -> str:
    kind = "jsonb" if isinstance(element, jsonb_text) else "json"
    return f"CAST({compiler.process(next(iter(element.clauses)), **kw)} AS {kind})"


@compiles(json_text, "sqlite")
def _sqlite_json_text(element: json_text, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(next(iter(element.clauses)), **kw)


def storable(text: str | None) -> str | None:
    """Provider text as both databases keep it whole: a NUL and an unpaired surrogate (a JSON
    body can carry either as an escape) become U+FFFD. PostgreSQL refuses both; SQLite cuts a
    `json_each` value at a NUL and stores a surrogate as invalid UTF-8 that no read decodes."""
    if text is None:
        return None
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


_DECODE_JSON = json.JSONDecoder().decode


def read_json(text: str | bytes | bytearray | memoryview) -> Any:
    """A stored JSON value, parsed: the engine's reader for both databases (psycopg's JSONB too)
    and for the hot statements' text. Every claimed request carries four JSON columns, and
    `json.loads` on psycopg's bytes (an encoding sniffed each time) was a tenth of the database
    lane's time on PostgreSQL. Both databases hand out UTF-8; a JSON null (params and
    response format left unset) is the usual value and is not parsed at all."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode()
    # Anything else that is not text (a number SQLite's json functions returned) raises TypeError,
    # as `json.loads` does: SQLAlchemy's SQLite JSON type passes numbers through on it.
    return None if text == "null" else _DECODE_JSON(text)


def read_json_column(value: Any) -> Any:
    """A JSON column's value as read: parsed already (SQLAlchemy's result processing, psycopg's
    JSONB), or its text (SQLite's hot statements run on the driver's cursor, with no result
    processing: `Dialect.run_all`). These columns always hold an object or null, never a bare
    JSON string, so text is always to parse."""
    return read_json(value) if isinstance(value, str) else value


def as_utc(value: Any) -> datetime:
    """A database time as an aware UTC datetime: the database's clock is UTC, and SQLite hands its
    times back naive (or as text)."""
    found: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
    return found.replace(tzinfo=UTC) if found.tzinfo is None else found.astimezone(UTC)


def seconds_between(earlier: Any, later: Any) -> float:
    """Seconds from one database time to another (never negative), whatever form each came in."""
    return max(0.0, (as_utc(later) - as_utc(earlier)).total_seconds())
