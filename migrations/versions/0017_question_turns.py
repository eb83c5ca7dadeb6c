"""enqueues of the same question take turns on a row of their own, not one lock for every enqueue

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 14:20:00

`llm_question_turns` holds one row per question (`cache_key`) the response cache has resolved on
PostgreSQL. An enqueue locks the rows of its new requests' questions before it reads which of
them are in flight, in place of the database-wide advisory lock every enqueue took: two
enqueues wait for each other only where they ask the same question.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table("llm_question_turns", sa.Column("cache_key", sa.String(length=64), primary_key=True))


def downgrade() -> None:
    op.drop_table("llm_question_turns")
