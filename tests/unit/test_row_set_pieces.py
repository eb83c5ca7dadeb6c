"""How SQLite is handed a set of rows: in pieces that fit one VALUES statement, and with the
columns no row has a value in written as NULL rather than bound row after row."""

from __future__ import annotations

from ledger.store.row_sets import RowSet, pieces, sqlite_statement

_COLUMNS = ("id", "text", "n")


def _set(n: int) -> RowSet:
    return RowSet(_COLUMNS, [{"id": i, "text": f"t{i}"} for i in range(n)])


def test_a_set_that_fits_is_one_piece_itself() -> None:
    whole = _set(40)
    assert list(pieces(whole, 40)) == [whole]
    empty = _set(0)
    assert list(pieces(empty, 40)) == [empty]


def test_a_larger_set_goes_in_full_pieces_then_powers_of_two_every_row_once_in_order() -> None:
    """The sizes a set can come in stay few (each a statement the driver prepares and keeps)."""
    for n in (41, 100, 333, 5000):
        parts = list(pieces(_set(n), 40))
        sizes = [len(p.rows) for p in parts]
        full = n // 40
        assert sizes[:full] == [40] * full
        assert all(s & (s - 1) == 0 and s < 40 for s in sizes[full:])  # powers of two, descending
        assert sizes[full:] == sorted(sizes[full:], reverse=True)
        assert [row["id"] for p in parts for row in p.rows] == list(range(n))
        assert all(p.columns == _COLUMNS for p in parts)


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
