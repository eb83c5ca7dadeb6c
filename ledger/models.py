"""The ledger's tables: every request, every attempt, every provider batch, every job.

Status columns are CHECK-constrained so a typo in hand-written SQL fails loudly.
Timestamps are filled from the database clock (`store.dialect.db_now`), never
from a process, so hosts sharing one PostgreSQL agree on leases and deadlines.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

# The status columns' values (ledger/statuses.py, importable without SQLAlchemy): their CHECK
# constraints are made here.
from ledger.statuses import AttemptOutcome, BatchStatus, Delivery, JobStatus, RequestStatus


def server_now() -> Any:
    """Server default for timestamps: valid on both databases, the database's clock."""
    return text("CURRENT_TIMESTAMP")


# BIGINT on PostgreSQL, INTEGER (the rowid alias) on SQLite so ids autoincrement on both.
IdType = BigInteger().with_variant(Integer(), "sqlite")
# JSONB on PostgreSQL so audits can index and query inside inputs and traces.
JsonType = JSON().with_variant(JSONB(), "postgresql")


def _check(column: str, enum: type[StrEnum]) -> CheckConstraint:
    values = ", ".join(f"'{member.value}'" for member in enum)
    return CheckConstraint(f"{column} IN ({values})", name=f"{column}_valid")


_OPEN_AUTO = text("deadline IS NOT NULL AND status IN ('queued', 'submitted')")


def _where_set(column: str) -> dict[str, Any]:
    """A partial index's predicate, on both databases: the rows where `column` is set."""
    where = text(f"{column} IS NOT NULL")
    return {"postgresql_where": where, "sqlite_where": where}


def _ts(nullable: bool = True, default_now: bool = False) -> Any:
    return Field(
        default=None,
        sa_column=Column(
            DateTime(timezone=True),
            nullable=nullable,
            server_default=server_now() if default_now else None,
        ),
    )


def _json(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(JsonType, nullable=nullable))


def _text() -> Any:
    return Field(default=None, sa_column=Column(Text, nullable=True))


class Job(SQLModel, table=True):
    """A unit of work a researcher starts; requests point at it for audit and fairness."""

    __tablename__ = "jobs"
    __table_args__ = (_check("status", JobStatus),)

    id: str = Field(sa_column=Column(String(200), primary_key=True))
    kind: str = Field(default="adhoc", sa_column=Column(String(50), nullable=False, server_default="adhoc"))
    status: str = Field(default=JobStatus.PENDING.value, sa_column=Column(String(20), nullable=False))
    phase: str | None = Field(default=None, sa_column=Column(String(50), nullable=True))
    spec: dict[str, Any] | None = _json()
    budget_usd: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    error: str | None = _text()
    # Every request that ended without a usable answer, one line each.
    errors: list[str] | None = _json()
    created_at: datetime | None = _ts(nullable=False, default_now=True)
    updated_at: datetime | None = _ts(nullable=False, default_now=True)
    started_at: datetime | None = _ts()
    completed_at: datetime | None = _ts()


class LlmBatch(SQLModel, table=True):
    """A provider batch job (OpenAI Batch API, Anthropic Message Batches).

    Written (`submitting`, its requests attached) before any provider call, so a
    crash at any moment leaves a row that says how far submission got: no
    `input_file_id` (nothing uploaded), no `provider_batch_id` (the create call
    may or may not have reached the provider: reconcile before submitting).
    `submit_key` is a random token carried in every `custom_id` (and, for
    OpenAI, in the batch's metadata): it tells this batch apart from any other
    on the provider account, including other ledgers' batch number N.
    Batches are leased like requests (`lease_owner`, `lease_token`,
    `lease_expires_at`): one daemon at a time submits or polls a batch.
    `status` is the ledger's word; `provider_status` the provider's, as last read
    (a local polling error goes to `poll_error`, never over what the provider said).
    """

    __tablename__ = "llm_batches"
    __table_args__ = (_check("status", BatchStatus), Index("ix_llm_batches_due", "status", "next_poll_at"))

    id: int | None = Field(default=None, sa_column=Column(IdType, primary_key=True, autoincrement=True))
    provider: str = Field(sa_column=Column(String(50), nullable=False))
    model: str = Field(sa_column=Column(String(200), nullable=False))
    params_key: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    job_id: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    submit_key: str | None = Field(default=None, sa_column=Column(String(32), nullable=True))
    status: str = Field(default=BatchStatus.QUEUED.value, sa_column=Column(String(20), nullable=False))
    provider_batch_id: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    provider_status: str | None = Field(default=None, sa_column=Column(String(50), nullable=True))
    request_total: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    input_bytes: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    input_file_id: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    output_file_id: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    error_file_id: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    request_counts: dict[str, Any] | None = _json()
    error: str | None = _text()
    poll_error: str | None = _text()
    lease_owner: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    lease_token: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    lease_expires_at: datetime | None = _ts()
    next_poll_at: datetime | None = _ts()
    cancel_requested_at: datetime | None = _ts()
    cancel_sent_at: datetime | None = _ts()
    # An `auto` request in it reached its deadline less LEDGER_DEADLINE_MARGIN_SECONDS (migration
    # 0015): the batch is canceled and what it has not answered goes online.
    fallback_at: datetime | None = _ts()
    adopted_at: datetime | None = _ts()  # found at the provider after a crash in the create window
    created_at: datetime | None = _ts(nullable=False, default_now=True)
    updated_at: datetime | None = _ts(nullable=False, default_now=True)
    submitted_at: datetime | None = _ts()
    completed_at: datetime | None = _ts()


class LlmRequest(SQLModel, table=True):
    """One model call a stage asked for, from enqueue to final outcome.

    `fair_seq` is the request's position within its job (1, 2, 3, ...). Claiming in
    (priority, fair_seq) order interleaves jobs round-robin: a small job queued
    after a huge one starts at once instead of waiting behind it.
    `lease_token` is a fencing token: it increases on every claim, and a write
    that carries an old token changes nothing.
    """

    __tablename__ = "llm_requests"
    __table_args__ = (
        _check("status", RequestStatus),
        _check("delivery", Delivery),
        UniqueConstraint("idempotency_key", name="uq_llm_requests_idempotency_key"),
        Index("ix_llm_requests_inflight", "status", "endpoint"),
        # A job's requests, in id order (a job's queries, and the web view's pages of them; migration
        # 0013, which dropped the (job_id, created_at) index no query ordered by).
        Index("ix_llm_requests_job_id", "job_id", "id"),
        Index("ix_llm_requests_created", "created_at"),
        # Only where set (decision 75): an online row never has a batch id, and has a completion
        # time only at the end; on PostgreSQL every UPDATE of a request would write them an entry.
        Index("ix_llm_requests_batch", "batch_id", **_where_set("batch_id")),
        Index("ix_llm_requests_completed", "completed_at", **_where_set("completed_at")),
        Index("ix_llm_requests_cache_key", "cache_key", **_where_set("cache_key")),
        Index("ix_llm_requests_twin_of", "twin_of", **_where_set("twin_of")),
        Index("ix_llm_requests_cached_from", "cached_from", **_where_set("cached_from")),
        # Delivery `auto`'s requests still open (migration 0015): what the deadline fallback reads.
        Index("ix_llm_requests_deadline", "deadline", postgresql_where=_OPEN_AUTO, sqlite_where=_OPEN_AUTO),
    )

    id: int | None = Field(default=None, sa_column=Column(IdType, primary_key=True, autoincrement=True))
    idempotency_key: str = Field(sa_column=Column(String(200), nullable=False))
    job_id: str | None = Field(default=None, sa_column=Column(String(200), ForeignKey("jobs.id"), nullable=True))
    fair_seq: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    purpose: str | None = Field(default=None, sa_column=Column(String(100), nullable=True))
    provider: str = Field(sa_column=Column(String(50), nullable=False))
    model: str = Field(sa_column=Column(String(200), nullable=False))
    endpoint: str = Field(sa_column=Column(String(300), nullable=False))
    input: dict[str, Any] = Field(sa_column=Column(JsonType, nullable=False))
    params: dict[str, Any] | None = _json()
    response_format: dict[str, Any] | None = _json()
    # Hash of params + response format: provider batches group requests that share it.
    batch_key: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    # SHA-256 of the request's body (ledger/fingerprint.py): a key reused with another body is a
    # conflict, not a repeat. NULL on rows enqueued before migration 0005.
    body_hash: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    delivery: str = Field(
        default=Delivery.ONLINE.value, sa_column=Column(String(10), nullable=False, server_default="online")
    )
    priority: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    status: str = Field(
        default=RequestStatus.QUEUED.value,
        sa_column=Column(String(20), nullable=False, server_default="queued"),
    )
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    next_attempt_at: datetime | None = _ts(nullable=False, default_now=True)
    lease_owner: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    lease_token: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    lease_expires_at: datetime | None = _ts()
    # Set by a cancel that found the call in flight: the row keeps its slot until the call
    # ends (or its lease expires), then ends `canceled`; see docs/decisions.md.
    cancel_requested_at: datetime | None = _ts()
    batch_id: int | None = Field(default=None, sa_column=Column(IdType, ForeignKey("llm_batches.id"), nullable=True))
    raw_output: str | None = _text()
    reasoning: str | None = _text()
    verdict_text: str | None = _text()
    parsed_verdict: Any | None = _json()
    parse_error: str | None = _text()
    error_code: str | None = Field(default=None, sa_column=Column(String(100), nullable=True))
    error_message: str | None = _text()
    last_status_code: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    input_tokens: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    output_tokens: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    cost_usd: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    latency_ms: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    trace: dict[str, Any] | None = _json()
    # The whole answer (migration 0008): which API was called (chat | responses | messages), the
    # provider's body as received (plain JSON on PostgreSQL too: its text is kept as it came, not
    # re-encoded), and the fields derived from it, beside raw_output (the answer's text).
    api: str | None = Field(default=None, sa_column=Column(String(20), nullable=True))
    response: Any | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    finish_reason: str | None = Field(default=None, sa_column=Column(String(20), nullable=True))
    provider_finish_reason: str | None = Field(default=None, sa_column=Column(String(100), nullable=True))
    tool_calls: list[dict[str, Any]] | None = _json()
    refusal: str | None = _text()
    thinking: str | None = _text()
    cached_input_tokens: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    cache_write_tokens: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    reasoning_tokens: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    # How the answer is parsed (migration 0009): `verdict` (or `verdict:LOW-HIGH`, its score
    # range) or `json`; NULL: not parsed here (an evaluation job's coordinator parses its own).
    parse: str | None = Field(default=None, sa_column=Column(String(40), nullable=True))
    parsed: Any | None = _json()  # parse = json: the answer's JSON value
    # The requests this one was built from (lineage), as given; indexed both ways in llm_request_sources.
    sources: list[int] | None = _json()
    # Budget: the worst-case cost (price x (input estimate + max_tokens)), fixed at enqueue;
    # reserved while a call may be spending it (set by the claim, cleared by the outcome).
    estimate_usd: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    reserved_usd: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    # Tokens the call may use at most (input bytes / 3 + max_tokens), fixed at enqueue: TPM caps.
    token_estimate: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    # When the parsers last derived reasoning / verdict from raw_output (NULL: not yet).
    parsed_at: datetime | None = _ts()
    # Of `attempts`, those refused because the account's quota was spent (migration 0012), or by
    # a rate limit the ledger waited out: they count towards no retry limit.
    parked: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    # The response cache (migration 0010): the hash of what decides the answer, with the
    # sample asked for (`ledger.enqueue.cache_key`); whether this request may be answered from
    # the cache; the request its answer was copied from (an original, never a copy); and,
    # while it waits for an identical request in flight to answer, that request (a twin is
    # never claimed).
    cache_key: str | None = Field(default=None, sa_column=Column(String(64), nullable=True))
    sample: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    use_cache: bool = Field(default=True, sa_column=Column(Boolean, nullable=False, server_default=true()))
    cached_from: int | None = Field(default=None, sa_column=Column(IdType, nullable=True))
    # The parameters the provider's API does not take, left out of what is sent (migration 0014):
    # their names, sorted; NULL when none was.
    dropped_params: list[str] | None = _json()
    twin_of: int | None = Field(default=None, sa_column=Column(IdType, nullable=True))
    # Delivery `auto` (migration 0015): the time by which it should be answered (set only for
    # `auto`), and how a completed request's answer came: `batch` or `online` (NULL: from the
    # response cache, or not completed).
    deadline: datetime | None = _ts()
    answered_via: str | None = Field(default=None, sa_column=Column(String(10), nullable=True))
    created_at: datetime | None = _ts(nullable=False, default_now=True)
    updated_at: datetime | None = _ts(nullable=False, default_now=True)
    completed_at: datetime | None = _ts()


# The claim query's order, exactly: (priority DESC, fair_seq, id) among queued online rows,
# so a claim reads a handful of index entries however many rows are queued.
_req = LlmRequest.__table__  # type: ignore[attr-defined]
Index("ix_llm_requests_claim", _req.c.status, _req.c.delivery, _req.c.priority.desc(), _req.c.fair_seq, _req.c.id)


class LlmRequestSource(SQLModel, table=True):
    """Lineage: request `request_id` was built from request `source_id` (one row per source)."""

    __tablename__ = "llm_request_sources"
    __table_args__ = (Index("ix_llm_request_sources_source", "source_id"),)

    request_id: int = Field(sa_column=Column(IdType, ForeignKey("llm_requests.id"), primary_key=True))
    source_id: int = Field(sa_column=Column(IdType, ForeignKey("llm_requests.id"), primary_key=True))


class LlmAttempt(SQLModel, table=True):
    """One network attempt of a request: the durable trace of every retry."""

    __tablename__ = "llm_attempts"
    __table_args__ = (
        _check("outcome", AttemptOutcome),
        UniqueConstraint("request_id", "attempt", name="uq_llm_attempts_request_attempt"),
        # The attempts answered 429 only (the web view's "had a 429" filter; migration 0013).
        Index(
            "ix_llm_attempts_429",
            "request_id",
            postgresql_where=text("status_code = 429"),
            sqlite_where=text("status_code = 429"),
        ),
    )

    id: int | None = Field(default=None, sa_column=Column(IdType, primary_key=True, autoincrement=True))
    request_id: int = Field(sa_column=Column(IdType, ForeignKey("llm_requests.id"), nullable=False))
    attempt: int = Field(sa_column=Column(Integer, nullable=False))
    # The provider batch that carried this attempt (delivery=batch); NULL for an online call.
    batch_id: int | None = Field(default=None, sa_column=Column(IdType, ForeignKey("llm_batches.id"), nullable=True))
    worker: str | None = Field(default=None, sa_column=Column(String(200), nullable=True))
    outcome: str = Field(
        default=AttemptOutcome.RUNNING.value,
        sa_column=Column(String(20), nullable=False, server_default="running"),
    )
    status_code: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    error_code: str | None = Field(default=None, sa_column=Column(String(100), nullable=True))
    error_message: str | None = _text()
    retry_delay_s: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    latency_ms: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    # What a batch answer paid for after its request had gone online at its deadline (migration
    # 0015): counted in the spend, never the request's result.
    cost_usd: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    started_at: datetime | None = _ts(nullable=False, default_now=True)
    finished_at: datetime | None = _ts()


class LlmPool(SQLModel, table=True):
    """Shared per-endpoint state every daemon respects: 429 cooldown, learned limit, slow start."""

    __tablename__ = "llm_pools"

    endpoint: str = Field(sa_column=Column(String(300), primary_key=True))
    cooldown_until: datetime | None = _ts()
    learned_limit: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    successes: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    updated_at: datetime | None = _ts(nullable=False, default_now=True)
    # Slow start: the most calls the pool has had in flight; above it a claim opens one more at a time.
    peak: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    # The provider's headers said: this many more calls may start before `window_until`.
    window_left: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    window_until: datetime | None = _ts()
    # Paused (migration 0012): the provider said the account's quota or balance is spent. No claim
    # of the pool until `cooldown_until`, then one call probes (`learned_limit` 1 meanwhile).
    paused_reason: str | None = Field(default=None, sa_column=Column(String(300), nullable=True))


class LlmPoolOverride(SQLModel, table=True):
    """A pool's limits as changed live by `ledger pools set` (migration 0015): read by every
    daemon's claim, over its settings, until `ledger pools reset` deletes the row. NULL: the
    setting (or its absence) stands for that limit."""

    __tablename__ = "llm_pool_overrides"

    endpoint: str = Field(sa_column=Column(String(300), primary_key=True))
    concurrency: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    rpm: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    tpm: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    updated_at: datetime | None = _ts(nullable=False, default_now=True)


class LlmQuestionTurn(SQLModel, table=True):
    """One row per question the response cache has resolved on PostgreSQL (its `cache_key`,
    migration 0017): the row an enqueue locks while it decides which request of that question
    is the original, so that enqueues of the same question take turns and enqueues of different
    questions never wait for each other (`Dialect.take_question_turns`). Holds nothing else;
    SQLite, whose writers take turns on the whole file, leaves it empty."""

    __tablename__ = "llm_question_turns"

    cache_key: str = Field(sa_column=Column(String(64), primary_key=True))


class LlmPoolCall(SQLModel, table=True):
    """A call started in a pool with an RPM/TPM cap: the pool's sliding window, pruned as it slides.

    `tokens` is the estimate (input + max_tokens) when the call starts, the provider's reported
    usage once it answers (0 for a 429: the provider refused it).
    """

    __tablename__ = "llm_pool_calls"
    __table_args__ = (
        Index("ix_llm_pool_calls_window", "endpoint", "started_at"),
        Index("ix_llm_pool_calls_request", "request_id", "attempt"),
    )

    id: int | None = Field(default=None, sa_column=Column(IdType, primary_key=True, autoincrement=True))
    endpoint: str = Field(sa_column=Column(String(300), nullable=False))
    request_id: int = Field(sa_column=Column(IdType, nullable=False))
    attempt: int = Field(sa_column=Column(Integer, nullable=False))
    tokens: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    started_at: datetime | None = _ts(nullable=False, default_now=True)


class LlmSlot(SQLModel, table=True):
    """One slot of the global limit (pool '') or of a pool's (PostgreSQL, migration 0016): a claim
    takes free ones (`FOR UPDATE SKIP LOCKED`) and writes the request it starts into `holder`; the
    transaction that ends that request's `running` frees it (a trigger). At most one holder per
    slot, and a claim takes only slots numbered up to its limit: the limit holds with no lock
    every claim waits for (`ledger/store/slots.py`). SQLite serialises its writers and leaves the
    table empty."""

    __tablename__ = "llm_slots"
    __table_args__ = (UniqueConstraint("holder", "pool", name="uq_llm_slots_holder"),)

    pool: str = Field(sa_column=Column(String(300), primary_key=True))
    slot_no: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    holder: int | None = Field(default=None, sa_column=Column(IdType, nullable=True))


class LlmWorker(SQLModel, table=True):
    """A live daemon: its heartbeat decides its fair share of the global limit."""

    __tablename__ = "llm_workers"

    worker_id: str = Field(sa_column=Column(String(200), primary_key=True))
    started_at: datetime | None = _ts(nullable=False, default_now=True)
    heartbeat_at: datetime | None = _ts(nullable=False, default_now=True)


class Opinion(SQLModel, table=True):
    """A judge's parsed opinion on one dimension; score NULL when evaluation failed."""

    __tablename__ = "opinions"
    # One opinion per (job, agent, dimension, sample): written once, whatever crashes (insert-if-absent).
    __table_args__ = (
        UniqueConstraint("job_id", "agent", "dimension", "sample", name="uq_opinions_job_agent_dimension_sample"),
    )

    id: int | None = Field(default=None, sa_column=Column(IdType, primary_key=True, autoincrement=True))
    job_id: str | None = Field(default=None, sa_column=Column(String(200), ForeignKey("jobs.id"), nullable=True))
    agent: str = Field(sa_column=Column(String(200), nullable=False))
    dimension: str = Field(sa_column=Column(String(200), nullable=False))
    # Which of a spec's `samples` this opinion answers (0 for a job without samples; migration 0011).
    sample: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    score: int | None = Field(default=None, sa_column=Column(Integer, nullable=True))
    argument: str | None = _text()
    cited_evidence: Any | None = _json()
    request_id: int | None = Field(default=None, sa_column=Column(IdType, ForeignKey("llm_requests.id"), nullable=True))
    # Why the source answer gave no score (the opinion is flagged; the raw output is kept).
    parse_error: str | None = _text()
    created_at: datetime | None = _ts(nullable=False, default_now=True)


metadata = SQLModel.metadata

# The audit views: one row per request, its attempt history folded in (migration 0001); one row
# per provider batch, with its requests' outcomes, cost and turnaround (migration 0003).
REQUEST_AUDIT_VIEW = "llm_request_audit"
BATCH_AUDIT_VIEW = "llm_batch_audit"
