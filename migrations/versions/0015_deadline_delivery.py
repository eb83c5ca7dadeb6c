"""delivery `auto`: a request's deadline and how it was answered; a batch's deadline fallback;
pool limits changed live

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 11:00:00

`llm_requests.deadline` is set only for `auto` requests (a partial index of the open ones: the
fallback looks for those near it); `answered_via` says whether a completed request's answer came from a
provider batch or an online call. `llm_batches.fallback_at` marks a batch canceled because one
of its `auto` requests reached its deadline less the margin. `llm_attempts.cost_usd` holds what
a batch answer cost when it came after its request had gone online (spent, not the result).
`llm_pool_overrides` holds a pool's limits as `ledger pools set` changed them, over its settings.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OPEN_AUTO = sa.text("deadline IS NOT NULL AND status IN ('queued', 'submitted')")


def upgrade() -> None:
    op.add_column("llm_requests", sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
    op.add_column("llm_requests", sa.Column("answered_via", sa.String(length=10), nullable=True))
    op.add_column("llm_batches", sa.Column("fallback_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("llm_attempts", sa.Column("cost_usd", sa.Float(), nullable=True))
    op.create_index(
        "ix_llm_requests_deadline",
        "llm_requests",
        ["deadline"],
        postgresql_where=_OPEN_AUTO,
        sqlite_where=_OPEN_AUTO,
    )
    op.create_table(
        "llm_pool_overrides",
        sa.Column("endpoint", sa.String(length=300), primary_key=True),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("CURRENT_TIMESTAMP")
        ),
    )


def downgrade() -> None:
    op.drop_table("llm_pool_overrides")
    op.drop_index("ix_llm_requests_deadline", table_name="llm_requests")
    # Plain DROP COLUMN (SQLite 3.35+): no table rebuild, so the views over these tables stay.
    op.drop_column("llm_attempts", "cost_usd")
    op.drop_column("llm_batches", "fallback_at")
    op.drop_column("llm_requests", "answered_via")
    op.drop_column("llm_requests", "deadline")
