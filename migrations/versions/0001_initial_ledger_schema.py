"""initial ledger schema: requests, attempts, batches, pools, jobs, opinions and the audit view

Revision ID: 0001
Revises:
Create Date: 2026-11-22 23:05:45.842285
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here on purpose: a migration must not change when the models do.
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


def upgrade() -> None:

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=50), server_default="adhoc", nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("phase", sa.String(length=50), nullable=True),
        sa.Column(
            "spec",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("budget_usd", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'running', 'completed', 'failed', 'canceled')", name="status_valid"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "llm_batches",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(length=50), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("params_key", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("provider_batch_id", sa.String(length=200), nullable=True),
        sa.Column(
            "request_counts",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'submitting', 'submitted', 'completed', 'error', 'canceled')",
            name="status_valid",
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "llm_workers",
        sa.Column("worker_id", sa.String(length=200), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=False
        ),
        sa.Column(
            "heartbeat_at", sa.DateTime(timezone=True), server_default=sa.text("CURRENT_TIMESTAMP"), nullable=False
        ),
        sa.PrimaryKeyConstraint("worker_id"),
    )
    op.create_table(
        "llm_pools",
        sa.Column("endpoint", sa.String(length=300), nullable=False),
        sa.Column("cooldown_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("learned_limit", sa.Integer(), nullable=True),
        sa.Column("successes", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("endpoint"),
    )
    op.create_table(
        "llm_requests",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=True),
        sa.Column("fair_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("purpose", sa.String(length=100), nullable=True),
        sa.Column("provider", sa.String(length=50), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=False),
        sa.Column(
            "input",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "response_format",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("delivery", sa.String(length=10), server_default="online", nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("status", sa.String(length=20), server_default="queued", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_token", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("raw_output", sa.Text(), nullable=True),
        sa.Column("reasoning", sa.Text(), nullable=True),
        sa.Column("verdict_text", sa.Text(), nullable=True),
        sa.Column(
            "parsed_verdict",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("parse_error", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(length=100), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column(
            "trace",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("delivery IN ('online', 'batch')", name="delivery_valid"),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'submitted', 'completed', 'error', 'canceled')",
            name="status_valid",
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["llm_batches.id"],
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key", name="uq_llm_requests_idempotency_key"),
    )
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.create_index("ix_llm_requests_batch", ["batch_id"], unique=False)
        batch_op.create_index(
            "ix_llm_requests_claim",
            ["status", "delivery", sa.text("priority DESC"), "fair_seq", "id"],
            unique=False,
        )
        batch_op.create_index("ix_llm_requests_created", ["created_at"], unique=False)
        batch_op.create_index("ix_llm_requests_inflight", ["status", "endpoint"], unique=False)
        batch_op.create_index("ix_llm_requests_job", ["job_id", "created_at"], unique=False)

    op.create_table(
        "llm_attempts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("outcome", sa.String(length=20), server_default="running", nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error_code", sa.String(length=100), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("retry_delay_s", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Integer(), nullable=True),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('running', 'succeeded', 'failed', 'timeout', 'lost', 'canceled')",
            name="outcome_valid",
        ),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["llm_requests.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("request_id", "attempt", name="uq_llm_attempts_request_attempt"),
    )
    op.create_table(
        "opinions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=200), nullable=True),
        sa.Column("agent", sa.String(length=200), nullable=False),
        sa.Column("dimension", sa.String(length=200), nullable=False),
        sa.Column("score", sa.Integer(), nullable=True),
        sa.Column("argument", sa.Text(), nullable=True),
        sa.Column(
            "cited_evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("request_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["llm_requests.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("opinions", schema=None) as batch_op:
        batch_op.create_index("ix_opinions_job", ["job_id", "agent", "dimension"], unique=False)

    op.execute(REQUEST_AUDIT_VIEW_SQL)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_request_audit")

    with op.batch_alter_table("opinions", schema=None) as batch_op:
        batch_op.drop_index("ix_opinions_job")

    op.drop_table("opinions")
    op.drop_table("llm_attempts")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_requests_job")
        batch_op.drop_index("ix_llm_requests_inflight")
        batch_op.drop_index("ix_llm_requests_created")
        batch_op.drop_index("ix_llm_requests_claim")
        batch_op.drop_index("ix_llm_requests_batch")

    op.drop_table("llm_requests")
    op.drop_table("llm_pools")
    op.drop_table("llm_workers")
    op.drop_table("llm_batches")
    op.drop_table("jobs")
