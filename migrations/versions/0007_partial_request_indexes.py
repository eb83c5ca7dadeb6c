"""partial request indexes: batch_id and completed_at are indexed only where they are set

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 17:00:00

PostgreSQL gives a row a new entry in every index that covers it at each UPDATE that changes
an indexed column, and `status` changes at every claim and every outcome: an online request,
which never has a batch id and has a completion time only at the end, wrote entries into
these two indexes for nothing at its insert (two), its claim (two) and its outcome (one).
Indexed only where set, they answer the same queries (`batch_id = x` and `completed_at >= x`
imply the column is set, on both databases) and the group commit and the claim write fewer
entries (decision 75).

On PostgreSQL both new indexes are built beside the old ones first (a build blocks writes to
llm_requests, not reads), then swapped in: the first DROP takes the table's exclusive lock,
held from there to the upgrade's COMMIT, through two drops and two renames only. SQLite
cannot rename an index; the upgrade holds the database's write lock, as any write does.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PARTIAL = {"ix_llm_requests_batch": "batch_id", "ix_llm_requests_completed": "completed_at"}


def upgrade() -> None:
    _replace_indexes(partial=True)


def downgrade() -> None:
    _replace_indexes(partial=False)


def _replace_indexes(*, partial: bool) -> None:
    def where(column: str) -> sa.TextClause | None:
        return sa.text(f"{column} IS NOT NULL") if partial else None

    if op.get_bind().dialect.name != "postgresql":
        for name, column in PARTIAL.items():
            op.drop_index(name, table_name="llm_requests")
            op.create_index(name, "llm_requests", [column], sqlite_where=where(column))
        return
    for name, column in PARTIAL.items():  # the builds, while the table is still read
        op.create_index(f"{name}_new", "llm_requests", [column], postgresql_where=where(column))
    for name in PARTIAL:  # the swaps, under the exclusive lock the first DROP takes
        op.drop_index(name, table_name="llm_requests")
        op.execute(f"ALTER INDEX {name}_new RENAME TO {name}")
