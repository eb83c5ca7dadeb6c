"""The values of the ledger's status columns, apart from the tables that hold them.

Kept out of `ledger.models` so that what only needs a status name (the command line's
options, input checks) does not import SQLModel and SQLAlchemy: every `ledger` process
starts by importing its command line, and the mock provider and `--help` need no database.
"""

from __future__ import annotations

from enum import StrEnum


class RequestStatus(StrEnum):
    QUEUED = "queued"  # waiting for a slot (or for next_attempt_at)
    RUNNING = "running"  # claimed by a worker: this row IS an occupied slot
    SUBMITTED = "submitted"  # inside a provider batch job
    COMPLETED = "completed"
    ERROR = "error"
    CANCELED = "canceled"


FINAL_STATUSES = (RequestStatus.COMPLETED, RequestStatus.ERROR, RequestStatus.CANCELED)
# Not final yet: waiting, in flight online, or inside a provider batch.
OPEN_STATUSES = (RequestStatus.QUEUED, RequestStatus.RUNNING, RequestStatus.SUBMITTED)


class Delivery(StrEnum):
    """The path a request takes now (the `delivery` column)."""

    ONLINE = "online"
    BATCH = "batch"


class DeliveryChoice(StrEnum):
    """What a caller asks for: a path, or `auto` (a provider batch at the discount, finished
    online what it has not answered by the request's deadline less a margin). An `auto` request
    is stored on one of the two paths with its `deadline` set: the deadline is what says `auto`."""

    ONLINE = "online"
    BATCH = "batch"
    AUTO = "auto"


class AnsweredVia(StrEnum):
    """How a completed request's answer came (`answered_via`): a provider batch or an online call."""

    BATCH = "batch"
    ONLINE = "online"


class AttemptOutcome(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    LOST = "lost"  # the worker died (lease expired) or was stopped mid-call
    CANCELED = "canceled"
    # The provider batch expired before reaching this request: no answer, not counted
    # against RETRY_MAX_ATTEMPTS (like a batch canceled before reaching it: `canceled`).
    EXPIRED = "expired"


class BatchStatus(StrEnum):
    QUEUED = "queued"
    SUBMITTING = "submitting"
    SUBMITTED = "submitted"
    COMPLETED = "completed"
    ERROR = "error"
    CANCELED = "canceled"


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
