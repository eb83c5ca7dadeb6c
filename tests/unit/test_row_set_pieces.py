"""How SQLite is handed a set of rows: in pieces that fit one VALUES statement, and with the
columns no row has a value in written as NULL rather than bound row after row."""

from __future__ import annotations

from ledger.store.row_sets import PIECE_STEP, RowSet, pieces, sqlite_statement

_COLUMNS = ("id", "text", "n")


def _set(n: int) -> RowSet:
    return RowSet(_COLUMNS, [{"id": i, "text": f"t{i}"} for i in range(n)])


def test_a_set_that_fits_is_one_piece_itself() -> None:
    whole = _set(40)
    assert list(pieces(whole, 40)) == [whole]
    empty = _set(0)
    assert list(pieces(empty, 40)) == [empty]


def test_a_larger_set_goes_in_few_pieces_of_few_sizes_every_row_once_in_order() -> None:
    """Pieces of whole steps of rows up to the fit, then the rest in one: few statements, and
    the sizes a set can come in stay few (each a statement the driver prepares and keeps)."""
    for n, fit in ((5000, 800), (5000, 3276), (1000, 300), (129, 128), (50, 20)):
        parts = list(pieces(_set(n), fit))
        sizes = [len(p.rows) for p in parts]
        assert max(sizes) <= fit and len(parts) <= n // fit + 2
        assert all(s % PIECE_STEP == 0 for s in sizes[:-1]) or fit < PIECE_STEP
        assert [row["id"] for p in parts for row in p.rows] == list(range(n))
        assert all(p.columns == _COLUMNS for p in parts)
    assert [len(p.rows) for p in pieces(_set(5000), 800)] == [768] * 6 + [384, 8]


def test_a_column_empty_in_every_row_is_null_in_the_statement_not_bound() -> None:
    rows = RowSet(_COLUMNS, [{"id": 1, "text": None}, {"id": 2, "text": "b"}])
    sql, args = sqlite_statement("SELECT * FROM ?", ("b_rows",), frozenset({"b_rows"}), {"b_rows": rows}, 999)
    assert rows.bound_columns == ("id", "text")
    assert args == (1, None, 2, "b")  # `n`, in no row, is not among them
    assert "column1 AS id, column2 AS text, NULL AS n" in sql and "VALUES (?, ?), (?, ?)" in sql


def test_the_first_column_is_bound_even_when_every_row_leaves_it_empty() -> None:
    """A VALUES row needs one value at least."""
    rows = RowSet(("id", "n"), [{"id": None}, {}])
    sql, args = sqlite_statement("SELECT * FROM ?", ("b_rows",), frozenset({"b_rows"}), {"b_rows": rows}, 999)
    assert args == (None, None)
    assert "column1 AS id, NULL AS n" in sql
