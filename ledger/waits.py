"""Waiting for whichever of several things happens first; task groups that fail as their task did;
a hand-off from a producer task to a consumer that takes everything waiting at once; items
handed straight to idle tasks."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


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
    so callers' `except BatchLeaseLost` / `except DatabaseUnavailable` see what really happened."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


class Handoff(Generic[T]):
    """Items from one producer task to one consumer task, which takes all that wait at once.

    Group commit for a stream: while the consumer writes one take, the producer fills the
    next, so takes grow to `most` when the consumer is the slower side and no fixed size has
    to fill before anything is written (a download that stalls half-way has its parsed
    lines written while it stalls). The producer waits while `capacity` items wait.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a Handoff holds at least one item, not {capacity}")
        self.capacity = capacity
        self._items: list[T] = []
        self._closed = False
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def put(self, item: T) -> None:
        if self._closed:  # the consumer may have stopped: the item would be dropped unseen
            raise RuntimeError("put into a closed Handoff")
        while len(self._items) >= self.capacity:
            await self._changed.wait()
        self._items.append(item)
        if len(self._items) == 1:  # the consumer may be waiting for anything at all
            self._notify()

    def close(self) -> None:
        """Nothing more comes: a `take` with nothing left returns empty."""
        self._closed = True
        self._notify()

    async def take(self, most: int) -> list[T]:
        """Up to `most` waiting items, oldest first, as soon as there is one; [] once closed and drained."""
        if most < 1:  # [] means "all done": a take of none would end its consumer early
            raise ValueError(f"a take gets at least one item, not {most}")
        while not self._items and not self._closed:
            await self._changed.wait()
        taken, self._items = self._items[:most], self._items[most:]
        if taken:
            self._notify()  # room for the producer
        return taken


class IdleTakers(Generic[T]):
    """Items handed straight to tasks that wait idle for one, each item to one task.

    The scheduler's executors wait here between requests. An anyio memory stream did
    the same at a cost the zero-latency benchmark could see: its `receive` passes a
    checkpoint (a turn of the event loop) and builds an event per item, and a waiter
    only counted as waiting after that checkpoint, so the sender had to keep its own
    count. Here a task is waiting from the moment it calls `wait`, and `give` knows it.
    """

    def __init__(self) -> None:
        self._idle: deque[asyncio.Future[T | None]] = deque()
        self._released = False

    def give(self, item: T) -> bool:
        """Hand `item` to the task that has waited longest; False when none waits."""
        while self._idle:
            waiting = self._idle.popleft()
            if not waiting.done():  # not cancelled while it waited
                waiting.set_result(item)
                return True
        return False

    async def wait(self) -> T | None:
        """The next item handed over; None once `release` was called (at once, if it was)."""
        if self._released:
            return None
        waiting: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._idle.append(waiting)
        return await waiting

    def release(self) -> None:
        """Nothing more will be given: every waiting task gets None, and so does every later `wait`."""
        self._released = True
        while self._idle:
            waiting = self._idle.popleft()
            if not waiting.done():
                waiting.set_result(None)
