"""The JSON log events, and the log set-up that writes them.

Each event line carries exactly its fixed fields, plus `request_id` and `ts`
(UNIX seconds). An operator can replay `acquired` minus `released` over a log
and see the slot count never exceed the limit: `acquired` is stamped after its
claim committed, `released` before its release committed, so even logs merged
from several daemons keep that order.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from ledger.store.rows import ClaimedRequest, ReleasedRows

EVENTS = logging.getLogger("ledger.events")
LOG = logging.getLogger("ledger")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; events keep their field order, other records get a message."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] | None = getattr(record, "event_fields", None)
        if fields is not None:
            line = dict(fields)
        else:
            line = {
                "event": "log",
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
            }
            extra: dict[str, Any] | None = getattr(record, "details", None)
            if extra:
                line.update(extra)
            if record.exc_info:
                line["error"] = self.formatException(record.exc_info).splitlines()[-1]
        line.setdefault("ts", round(record.created, 6))
        return json.dumps(line, default=str)


def configure_logging(level: str = "INFO", stream: Any = None) -> None:
    """Send every `ledger.*` record to stderr (or `stream`) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("ledger")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def wanted(level: int = logging.INFO) -> bool:
    """Whether events at `level` are written: callers that announce one event per request
    ask once per group, not build each event's fields to have it dropped."""
    return EVENTS.isEnabledFor(level)


def _emit(level: int, fields: dict[str, Any], ts: float | None = None) -> None:
    if EVENTS.isEnabledFor(level):
        fields["ts"] = round(ts if ts is not None else time.time(), 6)
        EVENTS.log(level, fields["event"], extra={"event_fields": fields})


def labels(trace: dict[str, Any] | None, custom_id: str) -> dict[str, str]:
    """What names a request in its events: the `agent` and `dimension` its trace has (an
    evaluation's, or a line's metadata), and its `custom_id` when it has no dimension. A plain
    request is not given an empty agent, nor its custom_id labelled as a dimension."""
    trace = trace or {}
    found: dict[str, str] = {key: str(trace[key]) for key in ("agent", "dimension") if key in trace}
    if "dimension" not in found:
        found["custom_id"] = custom_id
    return found


def request_labels(request: ClaimedRequest) -> dict[str, str]:
    return labels(request.trace, request.idempotency_key)


def queueing(
    request_id: int, trace: dict[str, Any] | None, custom_id: str, queue_depth: int, level: int = logging.INFO
) -> None:
    _emit(
        level,
        {
            "event": "queueing",
            **labels(trace, custom_id),
            "queue_depth": queue_depth,
            "request_id": request_id,
        },
    )


def acquired(request: ClaimedRequest, active_slots: int) -> None:
    _emit(
        logging.INFO,
        {"event": "acquired", **request_labels(request), "active_slots": active_slots, "request_id": request.id},
    )


def released(request: ClaimedRequest, active_slots: int, ts: float | None = None) -> None:
    _emit(
        logging.INFO,
        {"event": "released", **request_labels(request), "active_slots": active_slots, "request_id": request.id},
        ts,
    )


def slots_released(slots: ReleasedRows) -> None:
    """One `released` per request whose slot one transaction gave up, stamped before its commit."""
    if not wanted(logging.INFO):
        return
    for r in slots.requests:
        released(r, slots.active_slots, ts=slots.ts_before_commit)


def retry(request: ClaimedRequest, attempt: int, status_code: int | None, delay_s: float) -> None:
    _emit(
        logging.WARNING,
        {
            "event": "retry",
            **request_labels(request),
            "attempt": attempt,
            "status_code": status_code,
            "delay_s": round(delay_s, 3),
            "request_id": request.id,
        },
    )


def timeout(request: ClaimedRequest, timeout_s: float) -> None:
    _emit(
        logging.WARNING,
        {"event": "timeout", **request_labels(request), "timeout_s": timeout_s, "request_id": request.id},
    )


def failed(
    request: ClaimedRequest,
    status_code: int | None,
    error_code: str,
    message: str,
    attempts: int,
    elapsed_s: float,
) -> None:
    """The ERROR line of a request that used up its attempts (persistent failures)."""
    _emit(
        logging.ERROR,
        {
            "event": "failed",
            "level": "ERROR",
            **request_labels(request),
            "request_id": request.id,
            "status_code": status_code,
            "error_code": error_code,
            "message": message,
            "attempts": attempts,
            "elapsed_s": round(elapsed_s, 3),
        },
    )


def started(**limits: Any) -> None:
    """The INFO line at start naming the active limits."""
    _emit(
        logging.INFO,
        {
            "event": "start",
            "level": "INFO",
            "message": f"concurrency limit {limits.get('max_concurrent_llm_calls')}",
            **limits,
        },
    )


# -- provider batch jobs ----------------------------------------------------------------


def simulated_batching(provider: str, count: int) -> None:
    """Once per provider and daemon: its batch requests go through the online path."""
    _emit(
        logging.WARNING,
        {
            "event": "simulated_batching",
            "provider": provider,
            "requests": count,
            "message": f"provider {provider!r} has no batch API: its batch requests go through the online path",
        },
    )


def deadline_fallback(batch_id: int | None, pool: str, count: int) -> None:
    """Delivery `auto` at its deadline less the margin: requests taken out of a batch (canceled at
    the provider) or out of the batch queue (`batch_id` None) and called online."""
    where = f"batch {batch_id}" if batch_id is not None else "the batch queue"
    _emit(
        logging.WARNING,
        {
            "event": "deadline_fallback",
            "batch_id": batch_id,
            "pool": pool,
            "requests": count,
            "message": f"{count} request(s) of {pool} taken from {where} to finish online by their deadline",
        },
    )


def batch_submitted(
    batch_id: int,
    provider: str,
    provider_batch_id: str,
    requests: int,
    input_bytes: int,
    build_s: float,
    submit_s: float,
    step_started: float,
) -> None:
    _emit(
        logging.INFO,
        {
            "event": "batch_submitted",
            "batch_id": batch_id,
            "provider": provider,
            "provider_batch_id": provider_batch_id,
            "requests": requests,
            "input_bytes": input_bytes,
            "build_s": build_s,
            "submit_s": submit_s,
            "step_started": round(step_started, 6),
        },
    )


def quota_exhausted(pool: str, provider: str, reason: str, until: Any) -> None:
    """A pool paused: its provider said the account's quota or balance is spent. One line per
    pause (not per request): no request of the pool is claimed until `until`, then one probes.
    The line says its level, as `failed` does: an operator's alerting keys on ERROR."""
    _emit(
        logging.ERROR,
        {
            "event": "quota_exhausted",
            "level": "ERROR",
            "pool": pool,
            "provider": provider,
            "reason": reason,
            "until": until.isoformat() if hasattr(until, "isoformat") else str(until),
        },
    )


def cache_hit(request_id: int, cached_from: int) -> None:
    """A request answered from the response cache (at enqueue, or when the twin it waited for
    answered): no provider call, nothing spent."""
    _emit(logging.INFO, {"event": "cache_hit", "request_id": request_id, "cached_from": cached_from})


def batch_adopted(batch_id: int, provider: str, provider_batch_id: str, requests: int) -> None:
    """A batch the provider accepted before a crash kept the ledger from recording it."""
    _emit(
        logging.WARNING,
        {
            "event": "batch_adopted",
            "batch_id": batch_id,
            "provider": provider,
            "provider_batch_id": provider_batch_id,
            "requests": requests,
        },
    )


def batch_polled(batch_id: int, provider_batch_id: str, provider_status: str, worker: str, step_started: float) -> None:
    """`step_started`: when the step that polled took the batch's lease (logs show one step at a time)."""
    _emit(
        logging.INFO,
        {
            "event": "batch_polled",
            "batch_id": batch_id,
            "provider_batch_id": provider_batch_id,
            "provider_status": provider_status,
            "worker": worker,
            "step_started": round(step_started, 6),
        },
    )


def batch_mapped(
    batch_id: int, provider_batch_id: str, provider_status: str, mapped: Any, foreign: int, map_s: float
) -> None:
    """An ended batch written back: how each request ended, and the mapping rate."""
    lines = mapped.lines
    _emit(
        logging.INFO,
        {
            "event": "batch_mapped",
            "batch_id": batch_id,
            "provider_batch_id": provider_batch_id,
            "provider_status": provider_status,
            "completed": mapped.completed,
            "failed": mapped.failed,
            "retried": mapped.retried,
            "requeued": mapped.requeued,
            "canceled": mapped.canceled,
            "unchanged": mapped.kept,
            "foreign_lines": foreign,
            "map_s": map_s,
            "lines_per_s": round(lines / map_s) if map_s > 0 else None,
        },
    )


# -- evaluation jobs --------------------------------------------------------------------


def job_started(job_id: str, requests: int, **limits: Any) -> None:
    """The INFO line at a job's start naming the limits it runs under."""
    _emit(
        logging.INFO,
        {
            "event": "job_started",
            "level": "INFO",
            "job_id": job_id,
            "requests": requests,
            "message": f"job {job_id}: concurrency limit {limits.get('max_concurrent_llm_calls')}",
            **limits,
        },
    )


def job_ended(job_id: str, status: str, opinions: int, errors: int, error: str | None = None) -> None:
    _emit(
        logging.INFO if status == "completed" else logging.WARNING,
        {"event": "job_ended", "job_id": job_id, "status": status, "opinions": opinions, "errors": errors}
        | ({"error": error} if error else {}),
    )


def evaluation_failed(
    job_id: str, agent: str, dimension: str, request_id: int, status_code: int | None, attempts: int, elapsed_s: float
) -> None:
    """The ERROR line of a dimension whose last attempt failed (persistent failures)."""
    _emit(
        logging.ERROR,
        {
            "event": "evaluation_failed",
            "level": "ERROR",
            "job_id": job_id,
            "agent": agent,
            "dimension": dimension,
            "request_id": request_id,
            "status_code": status_code,
            "attempts": attempts,
            "elapsed_s": round(elapsed_s, 3),
        },
    )


def entry_rejected(job_id: str, agent: str, request_id: int, reason: str, raw: str) -> None:
    """A structured answer's entry discarded: WARNING with the raw entry; it is retried alone."""
    _emit(
        logging.WARNING,
        {
            "event": "entry_rejected",
            "level": "WARNING",
            "job_id": job_id,
            "agent": agent,
            "request_id": request_id,
            "reason": reason,
            "raw": raw,
        },
    )


def verdict_unparsed(job_id: str, agent: str, dimension: str, request_id: int, reason: str) -> None:
    """An answer with no usable VERDICT: the request stays completed, its opinion is flagged."""
    _emit(
        logging.WARNING,
        {
            "event": "verdict_unparsed",
            "level": "WARNING",
            "job_id": job_id,
            "agent": agent,
            "dimension": dimension,
            "request_id": request_id,
            "reason": reason,
        },
    )


def job_error(job_id: str, message: str) -> None:
    """A job's step raised: the job fails, the others go on."""
    _emit(logging.ERROR, {"event": "job_error", "level": "ERROR", "job_id": job_id, "message": message})
