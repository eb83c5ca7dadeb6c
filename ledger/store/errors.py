"""The store's own error for a database that is gone: what callers outside `ledger/store/` catch,
so that none of them needs to know the driver's exception types.

The database lane (`ledger/record.py: DbLane`) retries what passes (a dropped connection, a
lost COMMIT resolved as not applied, a restarting server) for its window; what still fails
after that, or fails in a way that will not pass, reaches its caller as `DatabaseUnavailable`,
the driver's error as its cause. A caller that uses the store directly, without a lane, turns
the driver's errors into this one with `database_unavailable()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError


class DatabaseUnavailable(Exception):
    """The database failed past the lane's retries (or in a way that will not pass); the driver's
    error is its `__cause__`, which `schema.one_line` shows as it would the driver's own."""


@contextmanager
def database_unavailable() -> Iterator[None]:
    """The driver's errors raised inside, as `DatabaseUnavailable`."""
    try:
        yield
    except DBAPIError as exc:
        raise DatabaseUnavailable(f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
