"""Task groups that fail as their task did: callers' `except` clauses must see the real exception."""

from __future__ import annotations

import anyio
import pytest

from ledger.waits import as_raised


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
