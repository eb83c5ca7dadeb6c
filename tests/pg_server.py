"""The PostgreSQL server the tests use: the one LEDGER_TEST_POSTGRES_URL names, or a throwaway one
(`ledger.embedded_postgres`, started once per session by `conftest.pg_server`).

A SIGTERM to pytest is turned into a KeyboardInterrupt, so the session's teardown stops the
throwaway server as after Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from types import FrameType

from ledger.embedded_postgres import EmbeddedPostgres, PostgresUnavailable

__all__ = ["ENV_VAR", "OLD_ENV_VAR", "EmbeddedPostgres", "PgServer", "PostgresUnavailable", "named_dsn", "trap_sigterm"]

ENV_VAR = "LEDGER_TEST_POSTGRES_URL"
OLD_ENV_VAR = "LEDGER_TEST_PG_DSN"  # the former name, still accepted


@dataclass(frozen=True)
class PgServer:
    """A reachable server: `dsn` for psycopg.connect, `embedded` when this run started it."""

    dsn: str
    embedded: bool

    def schema_url(self, schema: str) -> str:
        """A SQLAlchemy URL for the ledger whose search_path is `schema`."""
        scheme, rest = self.dsn.split("://", 1)
        if scheme not in ("postgresql", "postgres"):
            raise PostgresUnavailable(f"{ENV_VAR} must be a postgresql:// URL, not {self.dsn!r}")
        sep = "&" if "?" in rest else "?"
        return f"postgresql+psycopg://{rest}{sep}options=-csearch_path%3D{schema}"


def named_dsn() -> str | None:
    """The server named by the environment, as a libpq URL, or None."""
    url = os.environ.get(ENV_VAR) or os.environ.get(OLD_ENV_VAR)
    if not url:
        return None
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def trap_sigterm() -> None:
    """A SIGTERM ends the run as Ctrl-C does, so the session's teardown stops the server.

    Called again before each PostgreSQL test: code run in-process (an asyncio signal
    receiver) may have put the default action back."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_to_keyboard_interrupt)


def _sigterm_to_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
