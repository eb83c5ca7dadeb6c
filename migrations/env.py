"""Alembic environment: uses the caller's connection when given one (ledger.store.schema)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

import ledger.models  # noqa: F401 - registers the tables on the metadata
from ledger.models import metadata

config = context.config


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=metadata,
        render_as_batch=True,  # SQLite needs table rebuilds for most ALTERs
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from ledger.settings import load_settings
    from ledger.store.schema import normalize_url

    url = config.get_main_option("sqlalchemy.url") or normalize_url(load_settings().database_url)
    engine = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `ledger migrate`")
run_migrations_online()
