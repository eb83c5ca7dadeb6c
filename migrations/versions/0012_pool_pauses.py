"""a spent quota pauses its pool: why (`paused_reason`), until `cooldown_until`

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 15:30:00

A pool whose provider said the account's quota or balance is spent is paused: no request of it
is claimed by any daemon until `cooldown_until`, then one probes. `paused_reason` says why (NULL:
not paused; a plain cooldown after a 429 has none). The request whose call was refused goes back
to the queue; `llm_requests.parked` counts such attempts, which count towards no retry limit.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("llm_pools", sa.Column("paused_reason", sa.String(length=300), nullable=True))
    op.add_column("llm_requests", sa.Column("parked", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("llm_requests", "parked")
    op.drop_column("llm_pools", "paused_reason")
