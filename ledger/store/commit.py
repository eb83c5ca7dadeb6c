"""Transactions whose COMMIT may be lost on the way back, and how the store finds out what happened.

A PostgreSQL backend terminated while it commits (a fast restart, an operator's
`pg_terminate_backend`, a dropped network) leaves the client with an error and no
answer: the transaction may or may not have committed. Trying it again blindly
could apply it twice; giving up stops the daemon. Instead, every transaction that
takes the ledger's turn (shared or alone) learns its transaction id in the same statement (no extra
round trip), and after a lost COMMIT the store asks the server, on a new
connection, what became of that id (`pg_xact_status`):

- committed: the work is in; the caller goes on with the result it computed;
- aborted (or never known to the server): nothing was written; `CommitNotApplied`
  is raised, which the database lane retries like any transient failure.

A transaction that takes no turn can ask for its id too (`resolvable`, one round
trip more): the daemon's job and batch steps do. A transaction without a known id (or on
SQLite, which has no connection to lose) keeps the old rule, the error stops the caller, unless it is
`rerunnable`: one whose end state is the same however often it runs (a lease let
go, a worker retired, the batch loop's idle poll) is simply run again. A daemon's
idle loops commit such transactions every poll interval, and before this a backend
terminated at one of those COMMITs stopped the daemon.

A session the server ended because it sat idle inside a transaction (SQLSTATE 25P03, a
daemon frozen past `idle_in_transaction_session_timeout`, see `engine_setup.configure_engine`)
was rolled back by the server's own word: that FATAL comes before the next command runs, so
the COMMIT never ran. That lost COMMIT is `CommitNotApplied` with or without a known id, and
a read's closing ROLLBACK that finds its connection gone is no error at all (`reading`): the
rows were in hand and nothing was written.
Before this a daemon frozen inside one of its idle loops' reads stopped when it woke.

Also here: `reading`, and `any_row`, the reads that only ask whether something exists.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from ledger.store.dialect import READ_ONLY, XID_KEY, CommitNotApplied, CommitRerunnable, CommitUnknown, Dialect

LOG = logging.getLogger("ledger.store")
# PostgreSQL's SQLSTATE for a session ended by `idle_in_transaction_session_timeout`.
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
# How long to keep asking a restarting server what became of a transaction.
RESOLVE_WITHIN_S = 60.0


@contextmanager
def transaction(
    engine: Engine, dialect: Dialect, *, rerunnable: bool = False, resolvable: bool = False
) -> Iterator[Connection]:
    """`engine.begin()`, with a lost COMMIT resolved instead of left unknown (`rerunnable`: see
    above). `resolvable`: learn the transaction id first (a round trip on PostgreSQL) for a
    transaction that takes no turn and must not run twice: a job's phase, a batch's
    submission, a fenced step of the batch loop."""
    with engine.connect() as conn:
        # `info` lives as long as the pooled DBAPI connection: an id left by an earlier
        # transaction (rolled back, or run outside this function) must never be asked about.
        # (Cleared here, not on rollback: an invalidated connection's `info` cannot be read.)
        conn.info.pop(XID_KEY, None)
        trans = conn.begin()
        try:
            if resolvable:
                dialect.learn_transaction_id(conn)
            yield conn
        except BaseException:
            if trans.is_active:
                trans.rollback()
            raise
        xid = conn.info.pop(XID_KEY, None)
        try:
            trans.commit()
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            if _ended_while_idle(exc):
                raise CommitNotApplied("COMMIT", None, exc.orig or exc) from exc
            if xid is None:
                if rerunnable:
                    raise CommitRerunnable("COMMIT", None, exc.orig or exc) from exc
                raise
            try:
                committed = _committed(engine, dialect, xid)
            except (DBAPIError, _StillInProgress) as asking:  # no answer in time: the outcome stays unknown
                orig = asking.orig if isinstance(asking, DBAPIError) and asking.orig else exc.orig or exc
                raise CommitUnknown("COMMIT", None, orig) from exc
            if not committed:
                raise CommitNotApplied("COMMIT", None, exc.orig or exc) from exc
            LOG.warning(
                "COMMIT answer lost; the server says the transaction committed", extra={"details": {"xid": xid}}
            )


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """`engine.connect()` for reads: the ROLLBACK that ends the read may find the connection
    lost (the session ended while the daemon was frozen inside the read, a server restart) and
    that loses nothing. A statement that fails is still an error, which the lane retries. On
    SQLite the read takes no lock (`READ_ONLY`): it sees the last commit, even while a writer
    holds the file's write lock, and never waits for it."""
    conn = engine.connect().execution_options(**{READ_ONLY: True})
    try:
        yield conn
    finally:
        try:
            conn.close()
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            if _ended_while_idle(exc):  # news for an operator: this process was frozen past its bound
                LOG.warning("the server ended a read's session idle in its transaction (was this process frozen?)")
            else:
                LOG.debug("a read's connection was gone at its end: %s", exc.orig)


def _ended_while_idle(exc: DBAPIError) -> bool:
    """The server ended the session for sitting idle in its transaction: the COMMIT never ran."""
    return getattr(exc.orig, "sqlstate", None) == IDLE_IN_TRANSACTION_TIMEOUT


class _StillInProgress(Exception):
    """The old backend has not gone yet (its COMMIT may still land): ask again."""


def _committed(engine: Engine, dialect: Dialect, xid: str) -> bool:
    """Ask the server (again through a restart, within RESOLVE_WITHIN_S) whether `xid` committed.

    'in progress' means the old backend has not noticed the lost connection yet (or waits on a
    synchronous replica): its COMMIT may still land, so the answer is awaited, not guessed.
    """
    for attempt in Retrying(
        retry=retry_if_exception_type((DBAPIError, _StillInProgress)),
        wait=wait_exponential(multiplier=0.05, max=2.0),
        stop=stop_after_delay(RESOLVE_WITHIN_S),
        reraise=True,
    ):
        with attempt, engine.connect() as conn:
            status = dialect.transaction_status(conn, xid)
            if status == "in progress":
                raise _StillInProgress(xid)
            return status == "committed"
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


def any_row(engine: Engine, *queries: Select[Any]) -> bool:
    """Whether any of `queries` finds a row: asked in order on one connection, stopping at the
    first that does (put the cheap ones first)."""
    with reading(engine) as conn:
        return any(conn.execute(query.limit(1)).first() is not None for query in queries)
