"""the parameters a provider's API does not take, left out of what was sent (`dropped_params`)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 11:00:00

A request for a provider whose API has no such parameter (Anthropic's Messages API takes no
`temperature`) is sent without it; the request records the names it left out, so what was asked
and what was sent differ visibly. Existing rows keep the column empty: nothing was recorded
when they were sent. The request audit view gains the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
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
       r.trace, r.created_at, r.completed_at,
       r.api, r.finish_reason, r.provider_finish_reason, r.tool_calls, r.refusal, r.thinking,
       r.cached_input_tokens, r.cache_write_tokens, r.reasoning_tokens,
       r.cache_key, r.sample, r.cached_from
FROM llm_requests r
"""
_AUDIT_AFTER = _AUDIT_BEFORE.replace(
    "r.cache_key, r.sample, r.cached_from\n",
    "r.cache_key, r.sample, r.cached_from,\n       r.dropped_params\n",
)


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    # Plain ADD COLUMN on both databases: no table rebuild, which no view over it would survive.
    op.add_column("llm_requests", sa.Column("dropped_params", _JSONB, nullable=True))
    op.execute(_AUDIT_AFTER)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    op.drop_column("llm_requests", "dropped_params")
    op.execute(_AUDIT_BEFORE)
