"""cancel_requested_at: a cancel of a running request keeps its slot until the call ends

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_column("cancel_requested_at")
