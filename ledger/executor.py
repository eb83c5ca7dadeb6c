"""One claimed request: attempts under a timeout, back-off with the slot held, outcome.

The executor never decides alone what is durable: every attempt's end goes to
the recorder (and so to `llm_attempts`) before the next one starts, so a crash
at any point resumes at the right attempt number.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import anyio

from adapters.base import Adapter, CallRequest, CallResult
from adapters.errors import ProviderError
from adapters.rate_limits import RateLimits
from ledger import events
from ledger.parsing import derive
from ledger.pools import CALLS_OUT
from ledger.prices import PriceTable, input_bytes, most_tokens
from ledger.record import DbLane, Recorder
from ledger.retry import RetryPolicy
from ledger.store import Store
from ledger.store.lease_ends import Held
from ledger.store.rows import (
    AttemptFailure,
    ClaimedRequest,
    Completed,
    Failed,
    Outcome,
    PoolWindow,
    QuotaPause,
    ReleasedRows,
    RetryLater,
    Written,
)


class CallDeadlines:
    """Every call's timeout, on one timer for all the calls in flight instead of one each.

    A cancel scope with a deadline per call (anyio's `fail_after`) sets and cancels a timer on
    the event loop and enters a scope of its own for every call: at zero latency that was about
    an eighth of the daemon's CPU per request. Every call gets the
    same timeout, so deadlines come due in the order the calls started: the oldest call still
    out is the next one due, and a single timer, set for it, is all it takes. A call past its
    deadline is cut off by cancelling the scope it runs in (its lease's, `LeaseKeeper.working_on`,
    which the executor leaves once the timeout is recorded); `_call_within` tells that from a
    lease keeper's cut and raises TimeoutError.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._due: dict[Held, tuple[float, anyio.CancelScope]] = {}  # in the order the calls started
        self._expired: set[Held] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, key: Held, scope: anyio.CancelScope) -> None:
        """The call of `key` goes out now, in `scope`."""
        loop = asyncio.get_running_loop()
        self._due[key] = (loop.time() + self.timeout_s, scope)  # (`end` took a key's earlier call out)
        if self._timer is None or loop is not self._loop:  # (a timer of a loop gone never fires)
            self._set_timer(loop)

    def end(self, key: Held) -> bool:
        """The call of `key` is over; whether its deadline cut it off."""
        self._due.pop(key, None)
        if key in self._expired:
            self._expired.discard(key)
            return True
        return False

    def _set_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """One timer, for the oldest call out (the next one due), or none when no call is out."""
        if self._timer is not None:
            self._timer.cancel()
        self._loop = loop
        if not self._due:
            self._timer = None
            return
        due, _ = next(iter(self._due.values()))
        self._timer = loop.call_at(due, self._cut_off_due, loop)

    def _cut_off_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the scopes of the calls past their deadline, then set the timer for the next."""
        self._timer = None
        try:
            now = loop.time()
            while self._due:
                key, (due, scope) = next(iter(self._due.items()))
                if due > now:
                    break
                del self._due[key]
                if not scope.cancel_called:  # a lease cut came first: that is what ended the call
                    self._expired.add(key)
                    scope.cancel()
        finally:
            self._set_timer(loop)


@dataclass(frozen=True)
class CallContext:
    """What every executor of a daemon shares."""

    store: Store
    lane: DbLane
    recorder: Recorder
    policy: RetryPolicy
    timeout_s: float
    prices: PriceTable
    keep_response: bool = True  # LEDGER_KEEP_RESPONSE=full: the provider's body is kept whole
    quota_recheck_s: float = 900.0  # LEDGER_QUOTA_RECHECK_SECONDS: a spent balance's pause
    # LEDGER_RATE_LIMIT_GIVE_UP_SECONDS: how long 429s alone may keep a request from an answer
    # before it ends `error` (0: a 429 is an attempt like any other failure).
    rate_limit_give_up_s: float = 900.0

    @cached_property
    def deadlines(self) -> CallDeadlines:
        return CallDeadlines(self.timeout_s)


def stored_call(
    model: str,
    input_: dict[str, Any],
    params: dict[str, Any] | None,
    response_format: dict[str, Any] | None,
    api: str | None = None,
) -> CallRequest:
    """A request as the ledger stores it (`input` = system + messages), as an adapter takes it."""
    return CallRequest(
        model=model,
        messages=input_["messages"],
        system=input_.get("system"),
        params=params or {},
        response_format=response_format,
        api=api,
    )


# The executor's own records, made per request and per attempt on the hot path: plain slotted
# dataclasses, never changed once made (a frozen one is several times slower to make).
@dataclass(slots=True)
class _Drive:
    """One request on its way to an outcome: what each of its attempts shares."""

    request: ClaimedRequest
    adapter: Adapter
    ctx: CallContext
    scope: anyio.CancelScope  # its lease's: a lease cut or a deadline cancels it
    call: CallRequest
    started: float  # time.monotonic() when the executor took the request


@dataclass(slots=True)
class _Tried:
    """How one call ended (its answer, or the error it ends as), with what was known as it went out."""

    attempt: int
    began: float  # time.monotonic() as the call went out
    calls_out_before: int  # this daemon's calls to the pool out as it went out
    ended: CallResult | ProviderError


@dataclass(slots=True)
class _Decided:
    """The outcome to record for one attempt, and the error the events tell of once it is written
    (None: no event follows, as for an answer or a spent quota)."""

    outcome: Outcome
    error: ProviderError | None = None


async def execute(
    request: ClaimedRequest,
    adapter: Adapter,
    ctx: CallContext,
    scope: anyio.CancelScope,
    may_call: Callable[[], bool] = lambda: True,
) -> None:
    """Drive one request from its claimed attempt to a recorded outcome, in `scope` (its lease's).

    `may_call` is asked right before every call: False (the lease is not known good)
    means the call is not made; the lease keeper has cut the lease, and the row goes
    back to the queue when it expires (or is already another daemon's).
    Each pass is one attempt: the call, the outcome decided from how it ended, the outcome
    recorded; a next pass follows only a back-off with the slot held.
    """
    call = stored_call(request.model, request.input, request.params, request.response_format, request.api)
    drive = _Drive(request, adapter, ctx, scope, call, started=time.monotonic())
    attempt: int | None = request.attempt
    while attempt is not None and may_call():
        tried = await _try_once(drive, attempt)
        attempt = await _record(drive, await _decide(drive, tried))


async def _try_once(drive: _Drive, attempt: int) -> _Tried:
    """One call under its deadline; whatever it raises becomes the error it ends as."""
    request, ctx = drive.request, drive.ctx
    began = time.monotonic()
    out_before = CALLS_OUT.now(request.endpoint)
    ended: CallResult | ProviderError
    try:
        key = (request.id, request.token)
        ended = await _call_within(drive.adapter, drive.call, request.endpoint, ctx.deadlines, key, drive.scope)
    except TimeoutError:
        events.timeout(request, ctx.timeout_s)
        ended = ProviderError(f"no answer within {ctx.timeout_s}s", retryable=True, code="timeout")
    except ProviderError as exc:
        ended = exc
    except Exception as exc:  # an adapter bug must not take the daemon down
        ended = ProviderError(f"{type(exc).__name__}: {exc}", retryable=False, code="adapter_error")
    return _Tried(attempt=attempt, began=began, calls_out_before=out_before, ended=ended)


async def _decide(drive: _Drive, tried: _Tried) -> _Decided:
    """What one attempt comes to: an answer, a quota pause, the end in `error`, or a retry."""
    request, ctx, error = drive.request, drive.ctx, tried.ended
    if not isinstance(error, ProviderError):
        return _Decided(_completed(drive, tried, error))
    failure = AttemptFailure(
        status_code=error.status_code, error_code=error.code, message=error.message, latency_ms=_ms(tried.began)
    )
    if error.quota is not None:
        # The account can pay for no more: every request of the pool would be refused alike.
        # This one goes back to the queue without spending an attempt; the pool pauses.
        pause = QuotaPause(reason=error.quota, seconds=error.quota_for or ctx.quota_recheck_s)
        return _Decided(
            RetryLater(
                request=request, attempt=tried.attempt, failure=failure, delay_s=0.0, hold_slot=False, pause=pause
            )
        )
    rate_limited = error.status_code == 429 and error.retryable
    waited_out = rate_limited and await _waits_out(ctx, request, tried.attempt)
    given_up = rate_limited and ctx.rate_limit_give_up_s > 0 and not waited_out
    if given_up:
        failure = replace(failure, message=f"{error.message} (429s for {ctx.rate_limit_give_up_s:g} s and more)")
    # Refusals for a spent quota, and 429s waited out, count for no retry limit.
    if given_up or (not waited_out and not ctx.policy.should_retry(error, tried.attempt - request.parked)):
        failed = Failed(request=request, attempt=tried.attempt, failure=failure, elapsed_ms=_ms(drive.started))
        return _Decided(failed, error)
    return _Decided(_retry_later(drive, tried, error, failure, waited_out=waited_out), error)


def _completed(drive: _Drive, tried: _Tried, result: CallResult) -> Completed:
    """The answer as the recorder writes it: priced, parsed, its body kept as configured."""
    request, ctx = drive.request, drive.ctx
    provider, model = result.priced_as or (request.provider, request.model)
    cost = ctx.prices.answer_cost(provider, model, result)
    return Completed(
        request=request,
        attempt=tried.attempt,
        raw_output=result.text,
        latency_ms=_ms(tried.began),
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        status_code=result.status_code,
        cost_usd=cost,
        window=_window(result.limits, ctx.policy.max_delay),
        answer=result if ctx.keep_response else replace(result, response=None, response_text=None),
        derived=_derived(request, result),
    )


def _retry_later(
    drive: _Drive, tried: _Tried, error: ProviderError, failure: AttemptFailure, *, waited_out: bool
) -> RetryLater:
    """A retry: when, whether it keeps its slot meanwhile, and what a 429 teaches the pool."""
    request, ctx = drive.request, drive.ctx
    rate_limited = error.status_code == 429 and error.retryable
    window = _window(_refused_limits(error.limits, request) if rate_limited else error.limits, ctx.policy.max_delay)
    spent_for = window.reset_s if window is not None and window.remaining == 0 else None
    delay = ctx.policy.delay(tried.attempt, error.retry_after if error.retry_after is not None else spent_for)
    # A timeout gives its slot back and queues the retry. So does a 429: the pool's learned
    # limit (set in one step from it) or its cooldown is what holds the endpoint's traffic back
    # now, and a slot held through the back-off would only idle. Any other transient failure
    # keeps the slot through the back-off.
    # A cancelled scope (a lease cut, or a deadline that came as the call ended another way)
    # cannot sleep through a back-off: the slot goes back with the outcome.
    hold = not (error.code == "timeout" or rate_limited or drive.scope.cancel_called)
    # What a 429 teaches: this daemon's other calls to the pool out when it was refused. Counted
    # when it was sent and now, the more of the two: one answered while the refusal was on
    # its way back was still at the provider when it refused (over-counting costs a 429 more,
    # under-counting a slot until the next probe).
    out = max(tried.calls_out_before, CALLS_OUT.now(request.endpoint)) if rate_limited else None
    return RetryLater(
        request=request,
        attempt=tried.attempt,
        failure=failure,
        delay_s=delay,
        hold_slot=hold,
        pool_cooldown_s=delay if rate_limited and error.retry_after is not None else None,
        window=window,
        calls_out=out,
        uncounted=waited_out,
    )


async def _record(drive: _Drive, decided: _Decided) -> int | None:
    """Write the outcome and tell of it; the next attempt's number when one follows a back-off
    with the slot held, None when this executor is done with the request."""
    request, outcome, error = drive.request, decided.outcome, decided.error
    written = await drive.ctx.recorder.submit(outcome)
    # Not applied: ended canceled, or not ours any more: no error of ours, no retry of ours.
    if written is not Written.APPLIED or error is None:
        return None
    if isinstance(outcome, Failed):
        elapsed = time.monotonic() - drive.started
        events.failed(request, error.status_code, error.code, error.message, outcome.attempt, elapsed)
        return None
    assert isinstance(outcome, RetryLater)
    events.retry(request, outcome.attempt, error.status_code, outcome.delay_s)
    if not outcome.hold_slot:  # the slot went back with the outcome; the retry waits in the queue
        return None
    return await _after_back_off(drive, outcome.delay_s)


async def _after_back_off(drive: _Drive, delay: float) -> int | None:
    """Sleep through the back-off with the slot held, then begin the next attempt (None: the
    slot was given back, the request canceled, or taken over while we waited)."""
    request, ctx = drive.request, drive.ctx
    await anyio.sleep(delay)
    next_attempt = await ctx.lane.run(ctx.store.begin_attempt, request)
    if next_attempt.number is None:
        if next_attempt.freed_slot:
            events.slots_released(ReleasedRows([request], next_attempt.active_slots, next_attempt.ts_before_commit))
        ctx.recorder.notify_slot_freed()
    return next_attempt.number


async def _waits_out(ctx: CallContext, request: ClaimedRequest, attempt: int) -> bool:
    """Whether a 429 is one the ledger waits out, counting no attempt: the pool cools down or
    learns its limit, and the request retries, until 429s alone have refused it for
    `rate_limit_give_up_s` (0: never waited out). A first attempt has no run of 429s before it."""
    if ctx.rate_limit_give_up_s <= 0:
        return False
    if attempt == 1:
        return True
    return not await ctx.lane.run(ctx.store.rate_limited_for, request.id, attempt, ctx.rate_limit_give_up_s)


async def _call_within(
    adapter: Adapter, call: CallRequest, pool: str, deadlines: CallDeadlines, key: Held, scope: anyio.CancelScope
) -> CallResult:
    """The call, cut off with TimeoutError at its deadline (`deadlines` cancels `scope`, the scope it
    runs in), counted out in its pool meanwhile. Any other cancellation of `scope` (a lease cut)
    goes on as it is: the call ends, and nothing is recorded for it.

    After a timeout `scope` stays cancelled: the executor only records the timeout (a shielded
    wait) and leaves it, as a timeout gives its slot back and its retry waits in the queue."""
    CALLS_OUT.add(pool, 1)
    try:
        deadlines.start(key, scope)
        try:
            return await adapter.call(call, timeout=deadlines.timeout_s + 5)
        except (Exception, anyio.get_cancelled_exc_class(), BaseExceptionGroup) as exc:
            # Past its deadline, whatever the adapter raised is the timeout: the cancellation
            # itself, or an error that came out first (an adapter that finishes a response under
            # a shield sees the cancellation only later, if ever).
            if deadlines.end(key):
                raise TimeoutError from exc
            raise
    finally:
        deadlines.end(key)
        CALLS_OUT.add(pool, -1)


def _derived(request: ClaimedRequest, result: CallResult) -> dict[str, Any] | None:
    """The answer parsed as its request says (`parse`), to be written with it; None: not parsed here."""
    if request.parse is None:
        return None
    return derive(
        request.parse,
        result.text,
        response_format=request.response_format,
        finish_reason=result.finish_reason,
        params=request.params,
    )


def _window(limits: RateLimits | None, max_wait: float) -> PoolWindow | None:
    """The provider's rate-limit headers as the store reads them, the wait capped like a retry-after's."""
    found = limits.window() if limits is not None else None
    if found is None or limits is None:
        return None
    return PoolWindow(found[0], min(found[1], max_wait), time.monotonic(), limits.limit_requests)


def _refused_limits(limits: RateLimits | None, request: ClaimedRequest) -> RateLimits | None:
    """A 429's headers, with what the refused call would have cost: a 429 reports no usage, and a
    token window with fewer tokens left than that has room for no call of its size (the 429 was
    the window's, not the pool's concurrency). The cost is the ledger's own estimate of the
    request, the one a TPM cap reserves."""
    if limits is None or not limits.counts_tokens:
        return limits
    return replace(limits, call_tokens=most_tokens(input_bytes(request.input), request.params))


def _ms(since: float) -> int:
    return int((time.monotonic() - since) * 1000)
