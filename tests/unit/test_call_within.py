"""A call's own timeout against the lease keeper's cut: which one ended it decides what is recorded
(a `timeout` attempt, retried, or nothing: the lease is not ours any more)."""

from __future__ import annotations

import anyio
import pytest

from adapters.base import CallRequest
from adapters.mock import MockAdapter
from ledger.executor import _call_within
from ledger.pools import CALLS_OUT

CALL = CallRequest(model="m", messages=[{"role": "user", "content": "Evaluate item 1."}])


def test_a_call_past_its_timeout_raises_timeout_and_is_no_longer_counted_out() -> None:
    async def main() -> None:
        with pytest.raises(TimeoutError):
            await _call_within(MockAdapter(latency=30), CALL, 0.05, "mock:slow")
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
                await _call_within(MockAdapter(latency=30), CALL, 20, "mock:cut")
        assert cut.cancelled_caught  # cancelled, not turned into a TimeoutError
        assert CALLS_OUT.now("mock:cut") == 0

    anyio.run(main)


def test_an_answered_call_returns_its_result_and_is_no_longer_counted_out() -> None:
    async def main() -> None:
        result = await _call_within(MockAdapter(), CALL, 5, "mock:fast")
        assert result.text and CALLS_OUT.now("mock:fast") == 0

    anyio.run(main)
