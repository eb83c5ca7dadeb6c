"""Migrations and models never drift, and every command creates the schema on first use."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from typer.testing import CliRunner

from ledger.cli import app
from ledger.models import metadata
from ledger.store.schema import alembic_config, make_engine, newest_migration, upgrade


def head_revision() -> str | None:
    """Alembic's own head, read from the migration scripts."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_migrations_match_the_models(db_url: str) -> None:
    engine, _ = make_engine(db_url)
    assert upgrade(engine) is True
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    engine.dispose()
    assert diff == []


PARTIAL_INDEXES = {"ix_llm_requests_batch": "batch_id", "ix_llm_requests_completed": "completed_at"}


def _request_index_sql(conn: Connection, name: str) -> str:
    if conn.dialect.name == "postgresql":
        return str(conn.execute(text("SELECT pg_get_indexdef(CAST(:n AS regclass))"), {"n": name}).scalar_one())
    return str(conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :n"), {"n": name}).scalar_one())


def test_the_batch_and_completion_indexes_are_partial_in_the_models_and_the_migrations_both_ways(db_url: str) -> None:
    """`compare_metadata` does not compare index predicates: the models and the migrations must
    both say `IS NOT NULL` (decision 75), and a downgrade must give the whole indexes back."""
    table = metadata.tables["llm_requests"]
    for name, column in PARTIAL_INDEXES.items():
        (index,) = [i for i in table.indexes if i.name == name]
        for dialect in ("postgresql", "sqlite"):
            assert str(index.dialect_options[dialect]["where"]) == f"{column} IS NOT NULL"
    engine, _ = make_engine(db_url)
    assert upgrade(engine) is True
    cfg = alembic_config()
    with engine.connect() as conn:
        for name, column in PARTIAL_INDEXES.items():
            assert f"{column} IS NOT NULL" in _request_index_sql(conn, name)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0006")
        conn.commit()
        for name in PARTIAL_INDEXES:
            assert "WHERE" not in _request_index_sql(conn, name).upper()
        command.upgrade(cfg, "head")
        conn.commit()
        for name, column in PARTIAL_INDEXES.items():
            assert f"{column} IS NOT NULL" in _request_index_sql(conn, name)
    engine.dispose()


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
    env = {"LEDGER_DATABASE_URL": sqlite_url}
    nothing = CliRunner().invoke(app, ["requests"], env=env)  # no ledger yet: said so, none made
    assert nothing.exit_code == 2 and "no ledger at" in nothing.output and "no such table" not in nothing.output
    assert CliRunner().invoke(app, ["migrate"], env=env).exit_code == 0
    result = CliRunner().invoke(app, ["requests"], env=env)
    assert result.exit_code == 0, result.output


def test_the_revision_upgrade_checks_first_is_alembics_head() -> None:
    """`upgrade` compares the database with `newest_migration()` (read from the scripts' file
    names) before it imports Alembic. Were it behind Alembic's head, a database at the older
    head would pass that check and never be upgraded: every script is named for its revision."""
    versions = resources.files("migrations").joinpath("versions")
    for script in (entry for entry in versions.iterdir() if entry.name.endswith(".py")):
        assert f'revision: str = "{script.name[:4]}"' in script.read_text(), script.name
    assert newest_migration() == head_revision()


def test_a_database_one_migration_behind_is_upgraded_and_then_left_alone(db_url: str) -> None:
    """The quick check reads the revision the way Alembic records it: behind head it upgrades,
    at head it does nothing (and says so), on both databases."""
    engine, _ = make_engine(db_url)
    assert upgrade(engine) is True
    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "-1")
        conn.commit()
    assert upgrade(engine) is True
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision()
    assert upgrade(engine) is False
    engine.dispose()


def _imports_alembic_to_open(url: str) -> bool:
    """Whether a fresh process that opens the store on `url` had to import Alembic."""
    probe = "import sys; from ledger.store import Store; Store(sys.argv[1]).close(); print('alembic' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe, url], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def test_only_the_process_that_migrates_imports_alembic(db_url: str) -> None:
    """Every `ledger` command opens the store; on a database already at head it answers from
    two small queries, without Alembic's import (a tenth of a command's start-up, decision 83)."""
    assert _imports_alembic_to_open(db_url) is True  # a new database: migrated
    assert _imports_alembic_to_open(db_url) is False
