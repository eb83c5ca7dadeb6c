"""provider batch jobs: batch leases, submission state, provider status; attempts name their batch

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_OUTCOMES = "'running', 'succeeded', 'failed', 'timeout', 'lost', 'canceled'"

# Frozen here on purpose: a migration must not change when the models do. Turnaround is the
# one expression the two databases write differently.
_TURNAROUND = {
    "postgresql": "EXTRACT(EPOCH FROM (b.completed_at - b.submitted_at))",
    "sqlite": "(julianday(b.completed_at) - julianday(b.submitted_at)) * 86400.0",
}
REQUEST_AUDIT_VIEW_SQL = """
CREATE VIEW llm_request_audit AS
SELECT r.id, r.idempotency_key, r.job_id, r.provider, r.model, r.endpoint, r.status,
       r.attempts, r.last_status_code, r.error_code,
       (SELECT COUNT(*) FROM llm_attempts a WHERE a.request_id = r.id AND a.status_code = 429)
           AS rate_limited_attempts,
       r.input_tokens, r.output_tokens, r.cost_usd, r.latency_ms,
       r.trace, r.created_at, r.completed_at
FROM llm_requests r
"""
BATCH_AUDIT_VIEW_SQL = """
CREATE VIEW llm_batch_audit AS
SELECT b.id, b.provider, b.model, b.job_id, b.status, b.provider_status, b.provider_batch_id,
       b.request_total,
       (SELECT COUNT(*) FROM llm_requests r WHERE r.batch_id = b.id AND r.status = 'completed') AS completed,
       (SELECT COUNT(*) FROM llm_requests r WHERE r.batch_id = b.id AND r.status = 'error') AS failed,
       (SELECT SUM(r.input_tokens) FROM llm_requests r WHERE r.batch_id = b.id) AS input_tokens,
       (SELECT SUM(r.output_tokens) FROM llm_requests r WHERE r.batch_id = b.id) AS output_tokens,
       (SELECT SUM(r.cost_usd) FROM llm_requests r WHERE r.batch_id = b.id) AS cost_usd,
       b.created_at, b.submitted_at, b.completed_at,
       {turnaround} AS turnaround_s
FROM llm_batches b
"""


def upgrade() -> None:
    with op.batch_alter_table("llm_batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("submit_key", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("provider_status", sa.String(length=50), nullable=True))
        batch_op.add_column(sa.Column("request_total", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("input_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("input_file_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("output_file_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("error_file_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("poll_error", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("lease_token", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("next_poll_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("cancel_sent_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("adopted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_llm_batches_due", ["status", "next_poll_at"], unique=False)
    # SQLite adds a foreign key by rebuilding the table, which a view over it does not survive.
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    with op.batch_alter_table("llm_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_id", IdType, nullable=True))
        batch_op.create_foreign_key("fk_llm_attempts_batch_id", "llm_batches", ["batch_id"], ["id"])
        batch_op.drop_constraint("outcome_valid", type_="check")
        batch_op.create_check_constraint("outcome_valid", f"outcome IN ({_OUTCOMES}, 'expired')")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_key", sa.String(length=64), nullable=True))
    op.execute(REQUEST_AUDIT_VIEW_SQL)
    dialect = op.get_bind().dialect.name
    op.execute(BATCH_AUDIT_VIEW_SQL.format(turnaround=_TURNAROUND[dialect]))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_batch_audit")
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_column("batch_key")
    with op.batch_alter_table("llm_attempts", schema=None) as batch_op:
        batch_op.drop_constraint("fk_llm_attempts_batch_id", type_="foreignkey")
        batch_op.drop_column("batch_id")
        batch_op.drop_constraint("outcome_valid", type_="check")
        batch_op.create_check_constraint("outcome_valid", f"outcome IN ({_OUTCOMES})")
    op.execute(REQUEST_AUDIT_VIEW_SQL)
    with op.batch_alter_table("llm_batches", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_batches_due")
        for column in (
            "adopted_at",
            "cancel_sent_at",
            "cancel_requested_at",
            "next_poll_at",
            "lease_expires_at",
            "lease_token",
            "lease_owner",
            "poll_error",
            "error_file_id",
            "output_file_id",
            "input_file_id",
            "input_bytes",
            "request_total",
            "provider_status",
            "submit_key",
            "job_id",
        ):
            batch_op.drop_column(column)
