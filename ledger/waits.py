"""Waiting for whichever of several things happens first."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


async def first_done(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as any of `waits` returns; the others are cancelled."""
    async with anyio.create_task_group() as tg:
        for wait in waits:

            async def run(wait: Callable[[], Awaitable[object]] = wait) -> None:
                await wait()
                tg.cancel_scope.cancel()

            tg.start_soon(run)
