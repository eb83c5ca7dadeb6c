"""Plain values passed between the store and the stages around it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from ledger.store.dialect import read_json_column


@dataclass(frozen=True)
class ClaimedRequest:
    """A request this worker holds a slot for, with the fencing token of its lease."""

    id: int
    token: int
    attempt: int
    idempotency_key: str
    job_id: str | None
    provider: str
    model: str
    endpoint: str
    input: dict[str, Any]
    params: dict[str, Any]
    response_format: dict[str, Any] | None
    # The trace as read: parsed (psycopg's JSONB), or its JSON text (SQLite's hot rows). Only
    # events name a request's agent and dimension, so it is parsed when one first does (at INFO,
    # the `acquired` event of every request, on the event loop); a daemon logging at WARNING
    # never parses it. Parsed in the claim, it was a fifth of `to_claimed`.
    stored_trace: dict[str, Any] | str | None
    api: str | None = None  # chat | responses | messages (None: enqueued before migration 0008)
    parse: str | None = None  # how its answer is parsed when it comes (None: not here)
    # Of its attempts, those refused for a spent quota or by a rate limit waited out: no retry limit counts them.
    parked: int = 0

    @cached_property
    def trace(self) -> dict[str, Any]:
        return read_json_column(self.stored_trace) or {}


@dataclass(frozen=True)
class ReleasedRows:
    """Slots given up in one transaction, for the `released` events that follow its commit."""

    requests: list[ClaimedRequest]
    active_slots: int  # in flight across every worker once they were given up
    ts_before_commit: float


NOTHING_RELEASED = ReleasedRows([], 0, 0.0)


@dataclass(frozen=True)
class Claim:
    """What one claim transaction did."""

    requests: list[ClaimedRequest]
    active_slots: int  # requests in flight across every worker, after the claim
    # Expired leases of dead workers ended in the same transaction (requeued, canceled or spent).
    reclaimed: ReleasedRows = field(default=NOTHING_RELEASED)
    # time.monotonic() just before the leases were written: they run a full lease from no earlier.
    leased_at: float = 0.0
    # A pool in slow start grew by this claim: the claimer paces its next claim (pools.RAMP_PACE_S).
    ramping: bool = False


@dataclass(frozen=True)
class AttemptFailure:
    status_code: int | None
    error_code: str
    message: str
    latency_ms: int


@dataclass(frozen=True)
class PoolWindow:
    """What the provider's rate-limit headers said about its window with an answer: calls it
    will still start (0: spent) and seconds until it is whole again (capped by the caller).
    `answered_at` (time.monotonic(), 0: unknown): when the answer came; calls started since
    may not be counted in `remaining` yet."""

    remaining: int
    reset_s: float
    answered_at: float = 0.0
    limit: int | None = None  # the requests the window holds when whole, where the headers said


@dataclass(frozen=True)
class Completed:
    """The call succeeded: raw output and usage are written with `completed`."""

    request: ClaimedRequest
    attempt: int
    raw_output: str
    latency_ms: int
    input_tokens: int | None = None
    output_tokens: int | None = None
    status_code: int = 200
    cost_usd: float | None = None  # from the price table; None for a model it does not know
    window: PoolWindow | None = None  # the provider's rate-limit headers, when it sent any
    # The answer whole (`adapters.base.CallResult`): finish reason, tool calls, refusal,
    # thinking, usage breakdown and the body as received (`store/answers.py` writes them).
    answer: Any = None
    # The request's `parse` applied to the answer (`ledger.parsing.derive`): written with it.
    derived: dict[str, Any] | None = None


@dataclass(frozen=True)
class Failed:
    """No more attempts (or not retryable): the request ends in `error`."""

    request: ClaimedRequest
    attempt: int
    failure: AttemptFailure
    elapsed_ms: int = 0


@dataclass(frozen=True)
class RetryLater:
    """A retryable failure: the attempt is closed and the next one is due after `delay_s`.

    `hold_slot` keeps the row claimed through the back-off; otherwise
    the row goes back to the queue (a timeout releases its slot).
    `pool_cooldown_s`: a 429's retry-after; `window`: its rate-limit headers. What the pool
    learns from a 429 is decided by the store (`pools.note_outcomes`).
    """

    request: ClaimedRequest
    attempt: int
    failure: AttemptFailure
    delay_s: float
    hold_slot: bool = True
    pool_cooldown_s: float | None = None
    window: PoolWindow | None = None
    calls_out: int | None = None  # a 429: this daemon's other calls to the pool out when it came
    # The account's quota is spent: the request goes back to the queue without spending an
    # attempt, and the pool is paused (`pools.pause_pool`).
    pause: QuotaPause | None = None
    # A 429 the ledger waits out (LEDGER_RATE_LIMIT_GIVE_UP_SECONDS): back to the queue, the
    # attempt not counted against the retry limit, as for a spent quota.
    uncounted: bool = False


@dataclass(frozen=True)
class QuotaPause:
    """Why a pool pauses (the provider's words), and for how long before one request probes."""

    reason: str
    seconds: float


Outcome = Completed | Failed | RetryLater


class Written(Enum):
    """What became of one outcome the recorder wrote."""

    APPLIED = "applied"  # written as reported
    CANCELED = "canceled"  # a cancel was waiting for this call: the request ended `canceled` here
    REFUSED = "refused"  # the row is no longer this lease's (taken over): nothing changed


@dataclass(frozen=True)
class Recorded:
    """What recording a group of outcomes did, for the events that follow the commit."""

    written: list[Written]  # per outcome
    active_slots: int  # in flight after the outcomes, before any claim made in the same transaction
    ts_before_commit: float
    claim: Claim | None = None
    # Twins answered from this group's originals (request id, cached_from): response cache hits.
    cache_hits: list[tuple[int, int]] = field(default_factory=list)
    # Pools this group paused (a spent quota), for the one ERROR line each pause gets.
    paused: list[PausedPool] = field(default_factory=list)


@dataclass(frozen=True)
class PausedPool:
    endpoint: str
    provider: str
    reason: str
    until: Any  # the database's timestamp
