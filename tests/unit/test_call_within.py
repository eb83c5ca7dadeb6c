"""A call's own timeout against the lease keeper's cut: which one ended it decides what is recorded
(a `timeout` attempt, retried, or nothing: the lease is not ours any more). Every call's deadline
rides on one timer (`CallDeadlines`), which cuts off exactly the calls past theirs."""

from __future__ import annotations

import anyio
import pytest

from adapters.base import CallRequest, CallResult
from adapters.errors import ProviderError
from adapters.mock import MockAdapter
from ledger.executor import CallDeadlines, _call_within
from ledger.pools import CALLS_OUT

CALL = CallRequest(model="m", messages=[{"role": "user", "content": "Evaluate item 1."}])


def test_a_call_past_its_timeout_raises_timeout_and_is_no_longer_counted_out() -> None:
    async def main() -> None:
        with anyio.CancelScope() as scope, pytest.raises(TimeoutError):
            await _call_within(MockAdapter(latency=30), CALL, "mock:slow", CallDeadlines(0.05), (1, 1), scope)
        assert CALLS_OUT.now("mock:slow") == 0

    anyio.run(main)


def test_a_call_cut_off_from_outside_is_not_a_timeout() -> None:
    async def main() -> None:
        async def watch(cut: anyio.CancelScope) -> None:
            with anyio.fail_after(5):
                while CALLS_OUT.now("mock:cut") == 0:
                    await anyio.sleep(0)
            cut.cancel()  # as the lease keeper cuts a lapsing lease

        with anyio.CancelScope() as cut:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, cut)
                await _call_within(MockAdapter(latency=30), CALL, "mock:cut", CallDeadlines(20), (1, 1), cut)
        assert cut.cancelled_caught  # cancelled, not turned into a TimeoutError
        assert CALLS_OUT.now("mock:cut") == 0

    anyio.run(main)


def test_an_answered_call_returns_its_result_and_is_no_longer_counted_out() -> None:
    async def main() -> None:
        with anyio.CancelScope() as scope:
            result = await _call_within(MockAdapter(), CALL, "mock:fast", CallDeadlines(5), (1, 1), scope)
        assert result.text and CALLS_OUT.now("mock:fast") == 0
        assert not scope.cancel_called

    anyio.run(main)


def test_one_timer_cuts_off_each_call_at_its_own_deadline_and_no_other() -> None:
    """Calls started one after another, some answered in time: each slow one times out when its own
    deadline comes (not earlier, with an older call's; not later, behind a newer one), and the
    answered ones, before and after them in line, are never cut off."""
    timeout, apart = 1.0, 0.5
    deadlines = CallDeadlines(timeout)
    ended: dict[int, tuple[str, float]] = {}

    async def one(i: int, latency: float) -> None:
        started = anyio.current_time()
        with anyio.CancelScope() as scope:
            try:
                await _call_within(MockAdapter(latency=latency), CALL, "mock:line", deadlines, (i, 1), scope)
                ended[i] = ("answered", anyio.current_time() - started)
            except TimeoutError:
                ended[i] = ("timed out", anyio.current_time() - started)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for i, latency in enumerate([30, 0.01, 30, 0.3, 30]):
                tg.start_soon(one, i, latency)
                await anyio.sleep(apart)  # deadlines `apart` seconds apart

    anyio.run(main)
    assert {i: what for i, (what, _) in ended.items()} == {
        0: "timed out",
        1: "answered",
        2: "timed out",
        3: "answered",
        4: "timed out",
    }
    for i in (0, 2, 4):  # each at its own deadline, give or take the event loop's turn
        assert timeout <= ended[i][1] < timeout + apart, (i, ended[i])
    assert CALLS_OUT.now("mock:line") == 0


class ShieldedTail(MockAdapter):
    """An adapter that finishes its response under a shield (as an HTTP client closing a
    response does), then fails with a server error: a cancellation is seen late, or not at all."""

    def __init__(self, tail: float) -> None:
        super().__init__()
        self.tail = tail

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.tail)
        raise ProviderError("upstream failed", status_code=503, retryable=True)


def test_a_call_past_its_deadline_is_a_timeout_whatever_the_adapter_raised_after_it() -> None:
    """The deadline passes under the adapter's shield, and the adapter then raises its own error:
    the call still timed out, so the executor records a timeout and gives the slot back, rather
    than a server error whose back-off would sleep in a scope already cancelled."""

    async def main() -> None:
        with anyio.CancelScope() as scope, pytest.raises(TimeoutError):
            await _call_within(ShieldedTail(0.3), CALL, "mock:tail", CallDeadlines(0.05), (1, 1), scope)
        assert CALLS_OUT.now("mock:tail") == 0

    anyio.run(main)


def test_a_lease_cut_before_the_deadline_is_not_taken_for_a_timeout() -> None:
    """The lease keeper cuts the call, the adapter sees it only after its shielded tail, by which
    time the deadline has passed too: the cut came first, so it is no timeout (nothing is
    recorded for a cut lease), and the adapter's own error comes out as it is."""

    async def main() -> None:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cut() -> None:
                    with anyio.fail_after(5):
                        while CALLS_OUT.now("mock:cut-first") == 0:
                            await anyio.sleep(0)
                    scope.cancel()  # as the lease keeper cuts a lapsing lease, before the deadline

                tg.start_soon(cut)
                with pytest.raises(ProviderError):
                    await _call_within(ShieldedTail(0.3), CALL, "mock:cut-first", CallDeadlines(0.1), (1, 1), scope)
        assert CALLS_OUT.now("mock:cut-first") == 0

    anyio.run(main)
