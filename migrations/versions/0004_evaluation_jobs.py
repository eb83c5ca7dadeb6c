"""evaluation jobs: opinions once per (job, agent, dimension), job errors, budget reservations, parse marks

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JsonType = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("errors", JsonType, nullable=True))
        batch_op.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("estimate_usd", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("reserved_usd", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("parsed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_llm_requests_completed", ["completed_at"], unique=False)
    with op.batch_alter_table("opinions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parse_error", sa.Text(), nullable=True))
        batch_op.drop_index("ix_opinions_job")
        batch_op.create_unique_constraint("uq_opinions_job_agent_dimension", ["job_id", "agent", "dimension"])


def downgrade() -> None:
    with op.batch_alter_table("opinions", schema=None) as batch_op:
        batch_op.drop_constraint("uq_opinions_job_agent_dimension", type_="unique")
        batch_op.create_index("ix_opinions_job", ["job_id", "agent", "dimension"], unique=False)
        batch_op.drop_column("parse_error")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_requests_completed")
        batch_op.drop_column("parsed_at")
        batch_op.drop_column("reserved_usd")
        batch_op.drop_column("estimate_usd")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("started_at")
        batch_op.drop_column("errors")
