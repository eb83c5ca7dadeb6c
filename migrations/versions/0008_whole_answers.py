"""whole answers: the provider's body as received, the API called, finish reason, tool calls,
refusal, thinking, and the usage breakdown (cached input, cache writes, reasoning tokens)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 12:00:00

Existing rows keep the new columns empty: their bodies were never kept. `response` is plain
JSON on PostgreSQL (not JSONB) so the body's text is stored as it came. The request audit view
gains the same columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSONB = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
# Frozen here on purpose: a migration must not change when the models do.
_AUDIT_BEFORE = """
CREATE VIEW llm_request_audit AS
SELECT r.id, r.idempotency_key, r.job_id, r.provider, r.model, r.endpoint, r.status,
       r.attempts, r.last_status_code, r.error_code,
       (SELECT COUNT(*) FROM llm_attempts a WHERE a.request_id = r.id AND a.status_code = 429)
           AS rate_limited_attempts,
       r.input_tokens, r.output_tokens, r.cost_usd, r.latency_ms,
       r.trace, r.created_at, r.completed_at
FROM llm_requests r
"""
_AUDIT_AFTER = _AUDIT_BEFORE.replace(
    "r.trace, r.created_at, r.completed_at\n",
    "r.trace, r.created_at, r.completed_at,\n"
    "       r.api, r.finish_reason, r.provider_finish_reason, r.tool_calls, r.refusal, r.thinking,\n"
    "       r.cached_input_tokens, r.cache_write_tokens, r.reasoning_tokens\n",
)
_TURNAROUND = {
    "postgresql": "EXTRACT(EPOCH FROM (b.completed_at - b.submitted_at))",
    "sqlite": "(julianday(b.completed_at) - julianday(b.submitted_at)) * 86400.0",
}
_BATCH_AUDIT = """
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


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("api", sa.String(length=20), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        sa.Column("finish_reason", sa.String(length=20), nullable=True),
        sa.Column("provider_finish_reason", sa.String(length=100), nullable=True),
        sa.Column("tool_calls", _JSONB, nullable=True),
        sa.Column("refusal", sa.Text(), nullable=True),
        sa.Column("thinking", sa.Text(), nullable=True),
        sa.Column("cached_input_tokens", sa.Integer(), nullable=True),
        sa.Column("cache_write_tokens", sa.Integer(), nullable=True),
        sa.Column("reasoning_tokens", sa.Integer(), nullable=True),
    ]


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        for column in _columns():
            batch_op.add_column(column)
    op.execute(_AUDIT_AFTER)


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table, which no view over it survives.
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    op.execute("DROP VIEW IF EXISTS llm_batch_audit")
    with op.batch_alter_table("llm_requests", schema=None) as batch_op:
        for column in reversed(_columns()):
            batch_op.drop_column(column.name)
    op.execute(_AUDIT_BEFORE)
    op.execute(_BATCH_AUDIT.format(turnaround=_TURNAROUND[op.get_bind().dialect.name]))
