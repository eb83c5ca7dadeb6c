"""samples in evaluation jobs: an opinion per (job, agent, dimension, sample)

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 15:40:00

A job spec's `samples = N` asks every (judge, dimension) N times; each answer is an opinion of its
own. Existing opinions are sample 0, and the unique key gains the sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("opinions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sample", sa.Integer(), nullable=False, server_default="0"))
        batch_op.drop_constraint("uq_opinions_job_agent_dimension", type_="unique")
        batch_op.create_unique_constraint(
            "uq_opinions_job_agent_dimension_sample", ["job_id", "agent", "dimension", "sample"]
        )


def downgrade() -> None:
    op.execute("DELETE FROM opinions WHERE sample <> 0")
    with op.batch_alter_table("opinions", schema=None) as batch_op:
        batch_op.drop_constraint("uq_opinions_job_agent_dimension_sample", type_="unique")
        batch_op.create_unique_constraint("uq_opinions_job_agent_dimension", ["job_id", "agent", "dimension"])
        batch_op.drop_column("sample")
