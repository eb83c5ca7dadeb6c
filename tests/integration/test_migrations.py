"""Migrations and models never drift, and every command creates the schema on first use."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from typer.testing import CliRunner

from ledger.cli import app
from ledger.models import metadata
from ledger.store.schema import head_revision, make_engine, upgrade


def test_migrations_match_the_models(db_url: str) -> None:
    engine, _ = make_engine(db_url)
    assert upgrade(engine) is True
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_is_idempotent_and_creates_the_audit_view(db_url: str) -> None:
    engine, _ = make_engine(db_url)
    assert upgrade(engine) is True
    assert upgrade(engine) is False
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    assert {"llm_request_audit", "llm_batch_audit"} <= set(inspect(engine).get_view_names())
    engine.dispose()


def test_ledger_migrate_command_twice(db_url: str) -> None:
    runner = CliRunner()
    env = {"LEDGER_DATABASE_URL": db_url}
    first = runner.invoke(app, ["migrate"], env=env)
    second = runner.invoke(app, ["migrate"], env=env)
    assert first.exit_code == 0 and "upgraded" in first.output
    assert second.exit_code == 0 and "already at head" in second.output


def test_a_new_user_never_sees_no_such_table(sqlite_url: str) -> None:
    result = CliRunner().invoke(app, ["requests"], env={"LEDGER_DATABASE_URL": sqlite_url})
    assert result.exit_code == 0, result.output
