"""PostgreSQL: a session's hot statements prepared on the server, so a group commit is not
planned again and again.

`driver_runs.in_one_query` sends a transaction's statements as one simple query, one round
trip. A simple query is parsed and planned whole every time, a group commit's dozen
statements in every group commit: preparing them took a third off the server's CPU a request
at limit 10 with a zero-latency provider (decision 154). A statement prepared in the session is sent
in that same query as an `EXECUTE` with its values in place: the server plans it a few times,
then keeps one plan and plans again only when the plan for the given values would be costlier
(its `plan_cache_mode`), as for any prepared statement.

Each text is prepared the first time it is met while the session is outside a transaction
(the moment a transaction's first query is about to be sent), in a round trip of its own, so
a statement the server will not prepare costs nothing more than an error it ignores: that
text is sent whole from then on, as before. A text first met inside a transaction is
prepared at the session's next such moment. The hot statements are a dozen texts; at most
`PREPARED_AT_MOST` are prepared per session, so a text made for one call never fills it.
A statement's name is a hash of its text: whichever session prepared it, a name never runs
another statement.

Should a session lose what it prepared (a pooler resetting it, an operator's `DISCARD
ALL`), or a prepared statement's result no longer fit the table it reads (a migration run
meanwhile), the statement fails (`session_was_reset`): the session is dropped, and the
database lane runs the transaction again on a new one, which prepares afresh.

Only the daemon's sessions do this (`keep_hot_statements`, at connect), and in those the
driver prepares nothing of its own: psycopg, once it has prepared a statement, clears every
prepared statement of the session (`DEALLOCATE ALL`) after each rollback, ours with its own.
What SQLAlchemy runs in the daemon (lease renewals, heartbeats: a few statements a lease) is
planned each time, as it was before the driver's fifth run of it.

Server-side prepared statements belong to a session: a pooler that hands one server session
to several clients transaction by transaction (PgBouncer's transaction mode) does not keep
them. The ledger's daemons hold their sessions (advisory locks, `idle_in_transaction_session_timeout`),
so they are not meant to run behind such a pooler in any case.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from typing import Any

import psycopg

# Texts a session prepares at most (its hot statements are about a dozen).
PREPARED_AT_MOST = 64
# The server's errors for an EXECUTE of a statement the session does not have, and of one
# whose result's columns changed since it was prepared ("cached plan must not change result type").
_SESSION_RESET = {"26000", "0A000"}
# A PREPARE of a name the session has already prepared (the same text: names are hashes).
_ALREADY_PREPARED = "42P05"
# A parameter as SQLAlchemy's psycopg dialect writes it (`%(name)s`), or an escaped percent sign.
_PARAM = re.compile(r"%\((\w+)\)s|%%")


class _Session:
    """One session's prepared statements: text -> the EXECUTE that runs it (its parameters as
    `%(name)s`, for the client to bind), or None for a text the server would not prepare."""

    def __init__(self) -> None:
        self.executes: dict[str, str | None] = {}
        self.wanted: dict[str, None] = {}  # met inside a transaction: prepared at the next chance

    def prepare(self, raw: Any, texts: list[str]) -> None:
        """Prepare `texts` not met before (the session is outside a transaction)."""
        for sql in [*self.wanted, *texts]:
            if sql in self.executes or len(self.executes) >= PREPARED_AT_MOST:
                continue
            name = "ledger_hot_" + hashlib.blake2b(sql.encode(), digest_size=10).hexdigest()
            self.executes[sql] = _prepared(raw, name, sql)
        self.wanted.clear()


# The sessions that keep their hot statements prepared, by driver connection.
_SESSIONS: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()


def keep_hot_statements(raw: Any) -> None:
    """From now on the session `raw` (a new connection) keeps its hot statements prepared, and
    the driver prepares nothing of its own (which would clear ours at its next rollback)."""
    raw.prepare_threshold = None
    _SESSIONS[raw] = _Session()


def session_was_reset(exc: psycopg.Error) -> bool:
    """Whether `exc` says the session no longer has a statement it prepared, or that one's
    result no longer fits its tables: the session is to be dropped, not used again."""
    return exc.sqlstate in _SESSION_RESET


def as_sent(raw: Any, statements: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`statements` as they are sent in the session `raw`: a prepared one as its EXECUTE (the
    same parameters). With the session outside a transaction (its BEGIN not sent yet), the texts
    met first are prepared now; inside one, they are noted for its next moment outside. A
    session that does not keep its hot statements prepared gets them as they are."""
    session = _SESSIONS.get(raw)
    if session is None:
        return statements
    texts = [sql for sql, args in statements if isinstance(args, dict) and sql not in session.executes]
    if texts or session.wanted:
        if raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            session.prepare(raw, texts)
        else:
            session.wanted.update(dict.fromkeys(texts))
    sent = []
    for sql, args in statements:
        execute = session.executes.get(sql)
        sent.append((execute, args) if execute is not None else (sql, args))
    return sent


def _prepared(raw: Any, name: str, sql: str) -> str | None:
    """Prepare `sql` as `name`; the EXECUTE that runs it, or None if the server refused it."""
    order: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        param = match.group(1)
        if param is None:
            return "%"
        if param not in order:
            order.append(param)
        return f"${order.index(param) + 1}"

    try:
        raw.execute(f"PREPARE {name} AS {_PARAM.sub(numbered, sql)}", prepare=False)
    except psycopg.Error as exc:
        if exc.sqlstate != _ALREADY_PREPARED:
            if raw.closed or raw.info.status != psycopg.pq.ConnStatus.OK:
                raise  # not a refusal: the connection is gone (the caller's error handling says so)
            return None  # refused (it cannot be prepared): sent whole from now on
    return f"EXECUTE {name}({', '.join(f'%({p})s' for p in order)})" if order else f"EXECUTE {name}"
