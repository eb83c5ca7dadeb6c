"""The live loop's cost: one probe per interval however many pages listen, none while none does;
and a change is announced to every listener with the marks that moved."""

from __future__ import annotations

import anyio
import pytest

from ledger.web.live import Live


@pytest.mark.parametrize("listeners", [0, 1, 5])
def test_one_probe_per_interval_whatever_the_number_of_pages(listeners: int) -> None:
    marks = {"requests": "1", "jobs": "a"}
    heard: list[list[str]] = []

    async def go() -> int:
        live = Live(lambda: dict(marks), interval=0.05)
        streams = []
        for _ in range(listeners):
            send, receive = anyio.create_memory_object_stream[list[str]](8)
            live.listeners.add(send)
            streams.append(receive)
        async with anyio.create_task_group() as tg:
            tg.start_soon(live.run)
            with anyio.fail_after(5):
                while live.probes < 3 and listeners:
                    await anyio.sleep(0.01)
            marks["requests"] = "2"  # the ledger moved
            with anyio.fail_after(5):
                for receive in streams:
                    heard.append(await receive.receive())
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()
        return live.probes

    probes = anyio.run(go)
    if listeners == 0:
        assert probes == 0  # nobody listens: the database is not asked
    else:
        assert 3 <= probes <= 3 + 0.5 / 0.05 + 2  # about one per interval, not one per page
        assert heard == [["requests"]] * listeners


def test_a_listener_that_reads_nothing_does_not_block_the_others() -> None:
    live = Live(lambda: {}, interval=1)
    send, _receive = anyio.create_memory_object_stream[list[str]](1)
    live.listeners.add(send)
    for _ in range(5):
        live.announce(["requests"])  # the buffer fills; announcing goes on
    assert send in live.listeners


def test_closing_ends_every_open_stream_and_any_opened_after() -> None:
    """What a stopping server calls first: an open stream never ends by itself."""
    from starlette.requests import Request

    request = Request({"type": "http", "method": "GET", "path": "/events", "headers": []})

    async def read_all(live: Live) -> list[str]:
        response = live.stream(request)
        return [str(chunk) async for chunk in response.body_iterator]

    async def go() -> tuple[list[str], list[str], int]:
        live = Live(lambda: {}, interval=1)
        read: list[str] = []

        async def reader() -> None:
            read.extend(await read_all(live))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                while not live.listeners:
                    await anyio.sleep(0.01)
                live.close()
            late = await read_all(live)
        return read, late, len(live.listeners)

    read, late, listening = anyio.run(go)
    assert read == late == ["retry: 2000\n: listening\n\n"] and listening == 0
