"""the web view's indexes: a job's requests in id order, and the attempts answered 429

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 18:30:00

`ledger web` lists requests newest first (keyset on id). Filtered by job it walks
`ix_llm_requests_job_id` (job_id, id): the job's rows in the page's order, so a page of a
million-row job reads a page of entries, not the job (the older (job_id, created_at) index
would hand the planner the whole job to sort). That older index goes: every query by job is an
equality on job_id (which the new index serves alike) or orders by id, none by created_at, and
each enqueued row wrote an entry in both. "Had a 429" reads `ix_llm_attempts_429`, a
partial index of the attempts answered 429 only: small, and written only when a 429 is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TOO_MANY = sa.text("status_code = 429")


def upgrade() -> None:
    op.create_index("ix_llm_requests_job_id", "llm_requests", ["job_id", "id"])
    op.drop_index("ix_llm_requests_job", table_name="llm_requests")
    op.create_index(
        "ix_llm_attempts_429",
        "llm_attempts",
        ["request_id"],
        postgresql_where=_TOO_MANY,
        sqlite_where=_TOO_MANY,
    )


def downgrade() -> None:
    op.drop_index("ix_llm_attempts_429", table_name="llm_attempts")
    op.create_index("ix_llm_requests_job", "llm_requests", ["job_id", "created_at"])
    op.drop_index("ix_llm_requests_job_id", table_name="llm_requests")
