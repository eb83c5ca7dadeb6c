"""Shared fixtures: a real SQLite file or a fresh PostgreSQL schema per test.

PostgreSQL tests never skip: when the server is unreachable they fail, so CI
cannot pass by accident on a machine without the database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

PG_DSN = os.environ.get("LEDGER_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
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
        if name in SETTINGS_ENV or (name.startswith("LEDGER_") and name != "LEDGER_TEST_PG_DSN"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def pg_schema_url(schema: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose search_path is a brand-new schema, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required for this test and is unreachable at {PG_DSN}: {exc}")
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield pg_schema_url(schema)
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
