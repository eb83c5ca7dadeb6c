"""One claimed request: attempts under a timeout, back-off with the slot held, outcome.

The executor never decides alone what is durable: every attempt's end goes to
the recorder (and so to `llm_attempts`) before the next one starts, so a crash
at any point resumes at the right attempt number.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from adapters.base import Adapter, CallRequest, ProviderError
from ledger import events
from ledger.prices import PriceTable
from ledger.record import DbLane, Recorder
from ledger.retry import RetryPolicy
from ledger.store import Store
from ledger.store.rows import AttemptFailure, ClaimedRequest, Completed, Failed, ReleasedRows, RetryLater, Written


@dataclass(frozen=True)
class CallContext:
    """What every executor of a daemon shares."""

    store: Store
    lane: DbLane
    recorder: Recorder
    policy: RetryPolicy
    timeout_s: float
    prices: PriceTable


def stored_call(
    model: str, input_: dict[str, Any], params: dict[str, Any] | None, response_format: dict[str, Any] | None
) -> CallRequest:
    """A request as the ledger stores it (`input` = system + messages), as an adapter takes it."""
    return CallRequest(
        model=model,
        messages=input_["messages"],
        system=input_.get("system"),
        params=params or {},
        response_format=response_format,
    )


async def execute(
    request: ClaimedRequest, adapter: Adapter, ctx: CallContext, may_call: Callable[[], bool] = lambda: True
) -> None:
    """Drive one request from its claimed attempt to a recorded outcome.

    `may_call` is asked right before every call: False (the lease is not known good)
    means the call is not made; the lease keeper has cut the lease, and the row goes
    back to the queue when it expires (or is already another daemon's).
    """
    attempt = request.attempt
    started = time.monotonic()
    call = stored_call(request.model, request.input, request.params, request.response_format)
    while True:
        if not may_call():
            return
        t0 = time.monotonic()
        try:
            with anyio.fail_after(ctx.timeout_s):
                result = await adapter.call(call, timeout=ctx.timeout_s + 5)
        except TimeoutError:
            events.timeout(request.id, request.agent, request.dimension, ctx.timeout_s)
            error = ProviderError(f"no answer within {ctx.timeout_s}s", retryable=True, code="timeout")
        except ProviderError as exc:
            error = exc
        except Exception as exc:  # an adapter bug must not take the daemon down
            error = ProviderError(f"{type(exc).__name__}: {exc}", retryable=False, code="adapter_error")
        else:
            cost = ctx.prices.cost(request.provider, request.model, result.input_tokens, result.output_tokens)
            await ctx.recorder.submit(
                Completed(
                    request,
                    attempt,
                    result.text,
                    _ms(t0),
                    result.input_tokens,
                    result.output_tokens,
                    result.status_code,
                    cost,
                )
            )
            return
        failure = AttemptFailure(error.status_code, error.code, error.message, _ms(t0))
        if not ctx.policy.should_retry(error, attempt):
            written = await ctx.recorder.submit(Failed(request, attempt, failure, _ms(started)))
            if written is not Written.APPLIED:  # ended canceled, or not ours any more: not an error of ours
                return
            events.failed(
                request.id,
                request.agent,
                request.dimension,
                error.status_code,
                error.code,
                error.message,
                attempt,
                time.monotonic() - started,
            )
            return
        delay = ctx.policy.delay(attempt, error.retry_after)
        cooldown = delay if error.status_code == 429 and error.retry_after is not None else None
        timed_out = error.code == "timeout"
        # FR-008: a timeout gives its slot back and queues the retry; any other
        # transient failure keeps the slot through the back-off (seed 002), so
        # a rate-limited endpoint sees no new traffic from this request's slot.
        written = await ctx.recorder.submit(
            RetryLater(request, attempt, failure, delay, hold_slot=not timed_out, pool_cooldown_s=cooldown)
        )
        if written is not Written.APPLIED:  # canceled, or taken over: no retry of ours follows
            return
        events.retry(request.id, request.agent, request.dimension, attempt, error.status_code, delay)
        if timed_out:  # the slot went back with the outcome; the retry waits in the queue
            return
        await anyio.sleep(delay)
        next_attempt = await ctx.lane.run(ctx.store.begin_attempt, request)
        if next_attempt.number is None:  # gave the slot back, canceled, or taken over while we waited
            if next_attempt.freed_slot:
                events.slots_released(ReleasedRows([request], next_attempt.active_slots, next_attempt.ts_before_commit))
            ctx.recorder.notify_slot_freed()
            return
        attempt = next_attempt.number


def _ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)
