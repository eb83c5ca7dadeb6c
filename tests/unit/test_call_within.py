"""A call's own timeout against the lease keeper's cut: which one ended it decides what is recorded
(a `timeout` attempt, retried, or nothing: the lease is not ours any more). Every call's deadline
rides on one timer (`CallDeadlines`), which cuts off exactly the calls past theirs."""

from __future__ import annotations

import anyio
import pytest

from adapters.base import CallRequest
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
    timeout, apart = 0.5, 0.3
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
            for i, latency in enumerate([30, 0.01, 30, 0.2, 30]):
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
