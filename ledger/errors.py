"""The store's operator-facing error, importable without the database stack.

Every command wraps its work in `console.operator_errors`, which must know this type
before the store is imported: a command that fails on a bad setting, before it opens
any database, then ends without loading SQLAlchemy (decision 83).
"""

from __future__ import annotations


class DatabaseError(RuntimeError):
    """The database cannot be reached or used; the message is one line."""
