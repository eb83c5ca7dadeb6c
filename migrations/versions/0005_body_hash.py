"""request body hash: a custom_id reused with a different body is a conflict

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable and not backfilled: older rows are compared by their stored fields (ledger/fingerprint.py).
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("body_hash", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_column("body_hash")
