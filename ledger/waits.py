"""Waiting for whichever of several things happens first; task groups that fail as their task did."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import anyio


async def first_done(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as any of `waits` returns; the others are cancelled."""
    async with anyio.create_task_group() as tg:
        for wait in waits:

            async def run(wait: Callable[[], Awaitable[object]] = wait) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(run)


@contextmanager
def as_raised() -> Iterator[None]:
    """A task group that failed with one exception re-raises that exception, not a group of one,
    so callers' `except BatchLeaseLost` / `except DBAPIError` see what really happened."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
