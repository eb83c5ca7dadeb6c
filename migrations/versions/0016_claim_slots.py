"""the global limit's slots: claims on PostgreSQL no longer take one lock for the whole ledger

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 14:10:00

`llm_slots` holds one row per slot of `MAX_CONCURRENT_LLM_CALLS` (pool '') and of each pool's limit
(pool: the endpoint), numbered from 1, made by the claims as a limit needs them. A PostgreSQL claim
takes free slots (`holder` NULL) with `FOR UPDATE
SKIP LOCKED` and writes the requests it starts into them; a trigger frees a request's slot in the
very transaction that ends its `running` (any statement, any path: an outcome, a lease reclaimed,
a worker released, a slot given back) or deletes it. Requests running when this migration runs get
slots of their own here, so the limit counts them at once. SQLite serialises its writers (BEGIN
IMMEDIATE) and never uses the table: no trigger there.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The function and its triggers live in the ledger's schema (the first of the search path), as
# its tables do: ledgers in several schemas of one database each free their own slots.
_FUNCTION = """
CREATE OR REPLACE FUNCTION ledger_free_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE llm_slots SET holder = NULL WHERE holder = OLD.id;
    RETURN NULL;
END
$$
"""
_ON_UPDATE = """
CREATE TRIGGER llm_requests_free_slot AFTER UPDATE OF status ON llm_requests
FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running')
EXECUTE FUNCTION ledger_free_slot()
"""
_ON_DELETE = """
CREATE TRIGGER llm_requests_free_slot_deleted AFTER DELETE ON llm_requests
FOR EACH ROW WHEN (OLD.status = 'running')
EXECUTE FUNCTION ledger_free_slot()
"""
_ADOPT_RUNNING = """
INSERT INTO llm_slots (pool, slot_no, holder)
SELECT '', row_number() OVER (ORDER BY id), id FROM llm_requests WHERE status = 'running'
UNION ALL
SELECT endpoint, row_number() OVER (PARTITION BY endpoint ORDER BY id), id
FROM llm_requests WHERE status = 'running'
"""


def upgrade() -> None:
    op.create_table(
        "llm_slots",
        sa.Column("pool", sa.String(length=300), nullable=False),
        sa.Column("slot_no", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.PrimaryKeyConstraint("pool", "slot_no"),
        sa.UniqueConstraint("holder", "pool", name="uq_llm_slots_holder"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_FUNCTION)
        op.execute(_ON_UPDATE)
        op.execute(_ON_DELETE)
        op.execute(_ADOPT_RUNNING)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS llm_requests_free_slot_deleted ON llm_requests")
        op.execute("DROP TRIGGER IF EXISTS llm_requests_free_slot ON llm_requests")
        op.execute("DROP FUNCTION IF EXISTS ledger_free_slot()")
    op.drop_table("llm_slots")
