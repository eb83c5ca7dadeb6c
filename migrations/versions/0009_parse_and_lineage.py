"""parsers for any request and lineage: how a request's answer is parsed (`parse`), the JSON it
parsed to (`parsed`), the requests it was built from (`sources`, and the link table
`llm_request_sources` that indexes them both ways)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSONB = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("parse", sa.String(length=40), nullable=True))
        batch_op.add_column(sa.Column("parsed", _JSONB, nullable=True))
        batch_op.add_column(sa.Column("sources", _JSONB, nullable=True))
    op.create_table(
        "llm_request_sources",
        sa.Column("request_id", IdType, nullable=False),
        sa.Column("source_id", IdType, nullable=False),
        sa.ForeignKeyConstraint(["request_id"], ["llm_requests.id"]),
        sa.ForeignKeyConstraint(["source_id"], ["llm_requests.id"]),
        sa.PrimaryKeyConstraint("request_id", "source_id"),
    )
    with op.batch_alter_table("llm_request_sources", schema=None) as batch_op:
        batch_op.create_index("ix_llm_request_sources_source", ["source_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("llm_request_sources", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_request_sources_source")
    op.drop_table("llm_request_sources")
    # Plain DROP COLUMN (SQLite 3.35+): no table rebuild, so the views over llm_requests stay.
    for column in ("sources", "parsed", "parse"):
        op.drop_column("llm_requests", column)
