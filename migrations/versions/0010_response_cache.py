"""the response cache: what decides an answer (`cache_key`, with the `sample` asked for), whether a
request may be answered from the cache (`use_cache`), the request an answer was copied from
(`cached_from`), and the request in flight a twin waits for (`twin_of`)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 15:30:00

Existing rows keep `cache_key` empty: requests recorded before the cache are never its sources
(their key would need every stored request hashed again). The request audit view gains
`cache_key`, `sample` and `cached_from`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
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
       r.cached_input_tokens, r.cache_write_tokens, r.reasoning_tokens
FROM llm_requests r
"""
_AUDIT_AFTER = _AUDIT_BEFORE.replace(
    "r.cached_input_tokens, r.cache_write_tokens, r.reasoning_tokens\n",
    "r.cached_input_tokens, r.cache_write_tokens, r.reasoning_tokens,\n       r.cache_key, r.sample, r.cached_from\n",
)
_WHERE = {c: f"{c} IS NOT NULL" for c in ("cache_key", "twin_of", "cached_from")}


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    # Plain ADD COLUMN on both databases: no table rebuild, which no view over it would survive.
    for column in (
        sa.Column("cache_key", sa.String(length=64), nullable=True),
        sa.Column("sample", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("use_cache", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("cached_from", IdType, nullable=True),
        sa.Column("twin_of", IdType, nullable=True),
    ):
        op.add_column("llm_requests", column)
    for column, where in _WHERE.items():
        op.create_index(
            f"ix_llm_requests_{column}",
            "llm_requests",
            [column],
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )
    op.execute(_AUDIT_AFTER)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS llm_request_audit")
    for column in _WHERE:
        op.drop_index(f"ix_llm_requests_{column}", table_name="llm_requests")
    # Plain DROP COLUMN (SQLite 3.35+): no table rebuild, so the views over llm_requests stay.
    for column in ("twin_of", "cached_from", "use_cache", "sample", "cache_key"):
        op.drop_column("llm_requests", column)
    op.execute(_AUDIT_BEFORE)
