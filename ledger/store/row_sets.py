"""Rows handed to one statement as a table: a group commit's outcomes, a claim's picks, a chunk
of batch results. One set-based statement writes them all, where a statement per row costs a
step (SQLite) or a round trip (PostgreSQL) and an executor start each.

`bound_rows("v", "b_rows", column("id", BigInteger), ...)` is the table (`v.c.id`, joined to
a table with `v.match(table.c.id)`); `v.bind(rows)` gives its parameter, a `RowSet`. How the
rows reach the database is the dialects' business, and the one thing here that differs:

- PostgreSQL: one JSON parameter, `json_to_recordset`: the server parses it in one go.
- SQLite: a `VALUES` list of plain bound values, expanded for the number of rows when the
  statement runs (`sqlite_statement`). Read through `json_each`, every column of every row is a
  `json_extract` that walks the row's JSON again: a third of SQLite's own work in a group
  commit, and a tenth of the daemon's time per request. A set with more values
  than one statement may bind (the driver's limit; a chunk of batch results) still goes as
  JSON.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson
from sqlalchemy import BigInteger, Boolean, String, TypeDecorator, and_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import expression
from sqlalchemy.sql.compiler import SQLCompiler


@dataclass(frozen=True, eq=False)
class RowSet:
    """The value of a `bound_rows` parameter: its rows (dicts keyed by column name; a key
    left out is NULL), with the column order the table was declared in."""

    columns: tuple[str, ...]
    rows: Sequence[dict[str, Any]]

    @cached_property
    def as_json(self) -> str:
        """The rows as one JSON array. orjson: a chunk of batch results carries every answer's
        body, which the json module escaped at a sixth of the lane's time per mapped line; a
        value orjson refuses (an integer past 64 bits) goes through the json module."""
        try:
            return orjson.dumps(self.rows if isinstance(self.rows, list) else list(self.rows)).decode()
        except TypeError:
            return json.dumps(list(self.rows), separators=(",", ":"))

    @cached_property
    def keys(self) -> str:
        """The rows' `id`s as an array's text (see `bound_rows.match`)."""
        return "{" + ",".join([str(int(row["id"])) for row in self.rows]) + "}"

    @cached_property
    def bound_columns(self) -> tuple[str, ...]:
        """The columns that hold a value in some row (the first one always): a `VALUES` list binds
        these, and writes the others as NULL. The driver binds a None at fifteen times the cost of
        an int (0.37 us against 0.024: it looks for an adapter for it), and an answer's row
        has half a dozen fields most answers leave empty (tool calls, refusal, thinking, ...)."""
        rows, first = self.rows, self.columns[0]
        return tuple(name for name in self.columns if name == first or any(row.get(name) is not None for row in rows))

    @cached_property
    def flat(self) -> tuple[Any, ...]:
        """The values of `bound_columns` row after row: a `VALUES` list's parameters (once for the
        statements that share the set: a group commit's attempts and requests)."""
        columns = self.bound_columns
        return tuple([row.get(name) for row in self.rows for name in columns])


class RowSetType(String):
    """The type of a `bound_rows` parameter: how the store finds, in a compiled statement, the
    parameters whose value is a `RowSet` to pass in the dialect's way."""

    cache_ok = True


class bound_rows(expression.TableClause):
    """A `RowSet` used as a table (`UPDATE ... FROM`, `INSERT ... SELECT`, `NOT IN (SELECT ...)`)."""

    inherit_cache = False  # compiled once per engine by `Dialect`, never through the statement cache

    def __init__(self, name: str, param: str, *columns: expression.ColumnClause[Any], keys: str | None = None) -> None:
        """`keys`: the name of a parameter that also holds the rows' `id`s, as an array (see `match`)."""
        super().__init__(name, *columns)
        self.param, self.keys = param, keys
        self.column_names = tuple(c.name for c in columns)

    def rows(self, rows: Iterable[dict[str, Any]]) -> RowSet:
        return RowSet(self.column_names, list(rows))

    def bind(self, rows: Iterable[dict[str, Any]] | RowSet) -> dict[str, Any]:
        """The statement parameters for these rows: a `RowSet` made already (`rows`, shared by
        statements whose tables have the same columns), or the rows themselves."""
        row_set = rows if isinstance(rows, RowSet) else self.rows(rows)
        assert row_set.columns == self.column_names, "a RowSet is bound to a table of the same columns"
        if self.keys is None:
            return {self.param: row_set}
        return {self.param: row_set, self.keys: row_set.keys}

    def match(self, col: expression.ColumnElement[Any]) -> expression.ColumnElement[bool]:
        """`col = <this set's id>`: the join of a table to the rows, by a column it has an index on.

        PostgreSQL's planner takes a JSON set for 100 rows whatever it holds, and would rather
        scan the whole table than look 100 keys up until the table is tens of thousands of
        rows long (every group commit of a young ledger scanned every request it ever had).
        There the keys are also given as an array (`col = ANY(:keys)`), which it looks
        up by index; `bind` passes them as an array's text in the parameter named `keys` (a small one:
        parsing the set again for them cost as much as the update when it carries long
        outputs; and an array's text, not a list, which the driver would look at element by
        element: 38 us a list of fifty against 6 for a string). SQLite's planner needs no such hint.
        """
        assert self.keys is not None, "bound_rows.match needs the set's `keys` parameter"
        return and_(col == self.c.id, _set_keys(col, self))


def _rows_param(element: bound_rows, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(bindparam(element.param, type_=RowSetType()), **kw)


@compiles(bound_rows, "postgresql")
def _pg_rows(element: bound_rows, compiler: SQLCompiler, **kw: Any) -> str:
    types = compiler.dialect.type_compiler_instance
    cols = ", ".join(f"{c.name} {types.process(c.type)}" for c in element.columns)
    return f"json_to_recordset(CAST({_rows_param(element, compiler, **kw)} AS json)) AS {element.name}({cols})"


@compiles(bound_rows, "sqlite")
def _sqlite_rows(element: bound_rows, compiler: SQLCompiler, **kw: Any) -> str:
    # The parameter's place holds the whole SELECT, written when the statement runs (`sqlite_statement`).
    return f"({_rows_param(element, compiler, **kw)}) AS {element.name}"


class _set_keys(expression.FunctionElement[Any]):
    """`col` is one of the `id`s of a `bound_rows` set (see `bound_rows.match`)."""

    inherit_cache = False
    type = Boolean()

    def __init__(self, col: expression.ColumnElement[Any], rows: bound_rows) -> None:
        super().__init__(col)
        self.rows = rows


@compiles(_set_keys, "postgresql")
def _pg_set_keys(element: _set_keys, compiler: SQLCompiler, **kw: Any) -> str:
    col = compiler.process(next(iter(element.clauses)), **kw)
    key_type = compiler.dialect.type_compiler_instance.process(element.rows.c.id.type)
    keys = compiler.process(bindparam(element.rows.keys, type_=String()), **kw)
    return f"{col} = ANY(CAST({keys} AS {key_type}[]))"


@compiles(_set_keys, "sqlite")
def _sqlite_set_keys(element: _set_keys, compiler: SQLCompiler, **kw: Any) -> str:
    return "1 = 1"


def as_json(values: dict[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """PostgreSQL: the parameters `names` (`RowSet`s) as their JSON text."""
    return values | {name: values[name].as_json for name in names}


# Values a set may bind before it goes as JSON, whatever more the driver allows: a group commit
# of up to 546 outcomes. A chunk of thousands of batch results is as fast either way, but its
# VALUES statements, prepared and kept in the driver's statement cache, cost the daemon 28 MB
# of peak memory in `bench.batch_100k`.
SQLITE_VALUES_AT_MOST = 8192


def sqlite_statement(
    sql: str, names: tuple[str, ...], row_params: frozenset[str], values: dict[str, Any], max_values: int
) -> tuple[str, tuple[Any, ...]]:
    """SQLite: a compiled statement with `bound_rows` tables, written out for the rows it gets.

    The statement is split at its `?`; each `RowSet` parameter's `?` becomes `SELECT column1 AS
    id, ... FROM (VALUES (?, ...), ...)`, one tuple per row, or, past `max_values` values in the
    statement (the driver's limit, or SQLITE_VALUES_AT_MOST if that is less), or with no rows,
    `SELECT json_extract(value, '$.id') AS id, ... FROM json_each(?)` with the rows as JSON."""
    sets: list[RowSet] = [values[name] for name in names if name in row_params]
    as_values = len(names) - len(sets) + sum(len(s.rows) * len(s.bound_columns) for s in sets) <= max_values
    args: list[Any] = []
    shapes: list[_Shape] = []
    for name in names:
        value = values[name]
        if name not in row_params:
            args.append(value)
        elif as_values and value.rows:
            args.extend(value.flat)
            shapes.append((value.columns, value.bound_columns, len(value.rows)))
        else:
            args.append(value.as_json)
            shapes.append((value.columns, value.columns, 0))
    return _written_out(sql, names, row_params, tuple(shapes)), tuple(args)


# A set as a statement writes it: its columns, those bound (`RowSet.bound_columns`), its rows as
# VALUES (0: as JSON).
_Shape = tuple[tuple[str, ...], tuple[str, ...], int]


def pieces(row_set: RowSet, fit: int) -> Iterator[RowSet]:
    """A set in pieces of at most `fit` rows (SQLite: the rows one VALUES statement can bind), in
    as few statements as that allows, and in sizes that stay few whatever the set's size (each a
    statement the driver prepares once and keeps): multiples of `PIECE_STEP` rows, then the rest
    (fewer than that) in one piece. A set that fits (an empty one too) is one piece, itself."""
    rows, at = row_set.rows, 0
    if len(rows) <= fit:
        yield row_set
        return
    most = max(fit // PIECE_STEP * PIECE_STEP, min(fit, PIECE_STEP))
    while at < len(rows):
        left = len(rows) - at
        whole_steps = left // PIECE_STEP * PIECE_STEP
        size = min(most, whole_steps or left)
        yield RowSet(row_set.columns, rows[at : at + size])
        at += size


# Rows a piece of a large set comes in multiples of (`pieces`).
PIECE_STEP = 128


# Kept per shape: a daemon's groups come in a few sizes, up to its slot limit.
@functools.lru_cache(maxsize=512)
def _written_out(sql: str, names: tuple[str, ...], row_params: frozenset[str], shapes: tuple[_Shape, ...]) -> str:
    parts = sql.split("?")
    if len(parts) != len(names) + 1:  # a '?' in a literal would shift every value after it
        raise ValueError(f"a statement with bound rows has a '?' that is not a parameter: {sql[:200]}")
    out = [parts[0]]
    each = iter(shapes)
    for name, after in zip(names, parts[1:], strict=True):
        if name in row_params:
            columns, bound, n = next(each)
            out.append(_values_select(columns, bound, n) if n else _json_select(columns))
        else:
            out.append("?")
        out.append(after)
    return "".join(out)


def _values_select(columns: tuple[str, ...], bound: tuple[str, ...], n: int) -> str:
    row = "(" + ", ".join("?" * len(bound)) + ")"
    at = {name: i for i, name in enumerate(bound, 1)}
    picked = ", ".join(f"column{at[name]} AS {name}" if name in at else f"NULL AS {name}" for name in columns)
    return f"SELECT {picked} FROM (VALUES {', '.join([row] * n)})"


def _json_select(columns: tuple[str, ...]) -> str:
    picked = ", ".join(f"json_extract(value, '$.{name}') AS {name}" for name in columns)
    return f"SELECT {picked} FROM json_each(?)"


class IdList(TypeDecorator[Any]):
    """A list of ids bound as one parameter (`ids_in`): an array on PostgreSQL, a JSON array's text
    on SQLite. One parameter however many ids, and no IN list rendered anew for each length."""

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        # PostgreSQL: a real array parameter (a text cast to one is parsed again for every row).
        return dialect.type_descriptor(ARRAY(BigInteger) if dialect.name == "postgresql" else String())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        ids = [int(v) for v in value]
        return ids if dialect.name == "postgresql" else "[" + ",".join(map(str, ids)) + "]"


class ids_in(expression.FunctionElement[Any]):
    """`col` is one of the ids of the `IdList` parameter `param`, looked up by `col`'s index (a
    JSON set joined to the table costs PostgreSQL a scan of the id array per row looked up)."""

    inherit_cache = True
    type = Boolean()

    def __init__(self, col: expression.ColumnElement[Any], param: str) -> None:
        super().__init__(col, bindparam(param, type_=IdList()))

    def self_group(self, against: Any = None) -> Any:
        """Already a predicate. Grouped as a boolean, SQLite (no boolean type) would get
        `col IN (...) = 1`, which hides `col`'s index from its planner: a scan of the whole
        table for every statement, where each id should cost one lookup."""
        return self


@compiles(ids_in, "postgresql")
def _pg_ids_in(element: ids_in, compiler: SQLCompiler, **kw: Any) -> str:
    col, param = (compiler.process(c, **kw) for c in element.clauses)
    return f"{col} = ANY({param})"


@compiles(ids_in, "sqlite")
def _sqlite_ids_in(element: ids_in, compiler: SQLCompiler, **kw: Any) -> str:
    col, param = (compiler.process(c, **kw) for c in element.clauses)
    return f"{col} IN (SELECT value FROM json_each({param}))"
