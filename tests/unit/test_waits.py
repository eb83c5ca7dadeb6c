"""Task groups that fail as their task did (callers' `except` clauses must see the real exception);
the hand-off between a batch download and its writer."""

from __future__ import annotations

import anyio
import pytest

from ledger.waits import Handoff, IdleTakers, as_raised


class LeaseLost(Exception):
    pass


async def fail_in_a_task(*errors: Exception) -> None:
    async def boom(error: Exception) -> None:
        raise error

    with as_raised():
        async with anyio.create_task_group() as tg:
            for error in errors:
                tg.start_soon(boom, error)


def test_one_failure_is_raised_as_itself() -> None:
    with pytest.raises(LeaseLost):
        anyio.run(fail_in_a_task, LeaseLost("taken over"))


def test_several_failures_stay_a_group() -> None:
    with pytest.raises(BaseExceptionGroup) as caught:
        anyio.run(fail_in_a_task, LeaseLost("a"), ValueError("b"))
    assert len(caught.value.exceptions) == 2


# -- Handoff: the batch mapper's parsed lines, from the download to the writer ---------------


def test_a_take_gets_every_waiting_item_in_order_up_to_its_most() -> None:
    async def main() -> list[list[int]]:
        handoff = Handoff[int](capacity=10)
        for i in range(5):
            await handoff.put(i)
        handoff.close()
        return [await handoff.take(3), await handoff.take(3), await handoff.take(3)]

    assert anyio.run(main) == [[0, 1, 2], [3, 4], []]


def test_a_stalled_producer_does_not_keep_what_it_has_from_the_consumer() -> None:
    """A download that stalls half-way: what was parsed before the stall is taken at once,
    not held back until a full chunk is there."""

    async def main() -> tuple[list[int], list[int]]:
        handoff = Handoff[int](capacity=100)
        resume = anyio.Event()

        async def produce() -> None:
            for i in range(3):
                await handoff.put(i)
            await resume.wait()  # the stall
            await handoff.put(3)
            handoff.close()

        with anyio.fail_after(5):  # a take that waited for a full chunk would wait forever
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                during_stall = await handoff.take(100)
                resume.set()
                after = [i for chunk in [await handoff.take(100), await handoff.take(100)] for i in chunk]
        return during_stall, after

    assert anyio.run(main) == ([0, 1, 2], [3])


def test_the_producer_waits_while_capacity_items_wait() -> None:
    async def main() -> tuple[int, list[int], list[int]]:
        handoff = Handoff[int](capacity=2)
        put = 0

        async def produce() -> None:
            nonlocal put
            for i in range(5):
                await handoff.put(i)
                put += 1
            handoff.close()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                await anyio.wait_all_tasks_blocked()
                held_back = put  # two waiting, the third put blocked: memory stays bounded
                first = await handoff.take(10)
                rest: list[int] = []
                while chunk := await handoff.take(10):
                    rest += chunk
        return held_back, first, rest

    assert anyio.run(main) == (2, [0, 1], [2, 3, 4])


def test_a_handoff_refuses_what_would_lose_items_silently() -> None:
    """`take` answering [] means "all done": nothing may make it say so early, or drop a put."""

    async def main() -> None:
        handoff = Handoff[int](capacity=2)
        with pytest.raises(ValueError, match="at least one"):
            await handoff.take(0)
        handoff.close()
        with pytest.raises(RuntimeError, match="closed"):
            await handoff.put(1)

    anyio.run(main)
    with pytest.raises(ValueError, match="at least one"):
        Handoff[int](capacity=0)


# -- IdleTakers: the scheduler's idle executors, each handed the next claimed request ---------


def test_each_item_goes_to_one_idle_taker_longest_waiting_first() -> None:
    async def main() -> None:
        takers = IdleTakers[str]()
        got: list[tuple[int, str | None]] = []

        async def take(n: int) -> None:
            got.append((n, await takers.wait()))

        async with anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(take, n)
                await wait_idle(takers, n + 1)
            assert takers.give("a") and takers.give("b")
            takers.release()
        assert sorted(got) == [(0, "a"), (1, "b"), (2, None)]
        assert not takers.give("c")  # nobody waits any more: the caller starts a task instead
        with anyio.fail_after(5):
            assert await takers.wait() is None  # a taker that comes after the release never hangs

    anyio.run(main)


def test_an_item_is_never_given_to_a_taker_that_was_cancelled_while_it_waited() -> None:
    async def main() -> None:
        takers = IdleTakers[str]()
        got: list[str | None] = []

        async def take(scope: anyio.CancelScope) -> None:
            with scope:
                got.append(await takers.wait())

        async with anyio.create_task_group() as tg:
            first = anyio.CancelScope()
            tg.start_soon(take, first)
            await wait_idle(takers, 1)
            first.cancel()  # e.g. the daemon's stop cancelling an idle executor
            with anyio.fail_after(5):
                while not takers._idle[0].done():
                    await anyio.sleep(0)
            tg.start_soon(take, anyio.CancelScope())
            await wait_idle(takers, 1, live_only=True)
            assert takers.give("x")
        assert got == ["x"]

    anyio.run(main)


async def wait_idle(takers: IdleTakers[str], n: int, *, live_only: bool = False) -> None:
    """Until `n` takers wait (polled with a deadline: `wait` has no event to await)."""
    with anyio.fail_after(5):
        while sum(1 for f in takers._idle if not (live_only and f.done())) < n:
            await anyio.sleep(0)
