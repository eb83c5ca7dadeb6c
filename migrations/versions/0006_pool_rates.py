"""pool rates: RPM/TPM windows (llm_pool_calls), request token estimates, slow start and the
provider's announced window (llm_pools.peak, window_left, window_until)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 23:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "llm_pool_calls",
        sa.Column("id", IdType, autoincrement=True, nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=False),
        sa.Column("request_id", IdType, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("llm_pool_calls", schema=None) as batch_op:
        batch_op.create_index("ix_llm_pool_calls_window", ["endpoint", "started_at"], unique=False)
        batch_op.create_index("ix_llm_pool_calls_request", ["request_id", "attempt"], unique=False)
    with op.batch_alter_table("llm_pools", schema=None) as batch_op:
        batch_op.add_column(sa.Column("peak", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("window_left", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("window_until", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_estimate", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_column("token_estimate")
    with op.batch_alter_table("llm_pools", schema=None) as batch_op:
        batch_op.drop_column("window_until")
        batch_op.drop_column("window_left")
        batch_op.drop_column("peak")
    with op.batch_alter_table("llm_pool_calls", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_pool_calls_request")
        batch_op.drop_index("ix_llm_pool_calls_window")
    op.drop_table("llm_pool_calls")
