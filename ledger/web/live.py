"""Live pages: one probe loop per server announces what changed to every open page.

While at least one page listens, the loop asks the store for its change marks once per
`interval` (`BrowseQueries.change_marks`: one cheap, index-only query, the same on both
databases), however many pages are open; with none listening it asks nothing. When marks
differ from the last reading, each page gets the names of the marks that moved, and its script
(`static/ledger.js`) fetches again only the fragments that declared one of them (`data-on`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from starlette.requests import Request
from starlette.responses import StreamingResponse

KEEPALIVE_S = 15.0


class Live:
    """The probe loop and its listeners."""

    def __init__(self, probe: Callable[[], dict[str, Any]], interval: float = 1.0) -> None:
        self.probe = probe
        self.interval = interval
        self.listeners: set[MemoryObjectSendStream[list[str]]] = set()
        self.probes = 0  # readings taken (tests count them)
        self.closed = False

    async def run(self) -> None:
        """Runs for the server's life (its lifespan's task group)."""
        last: dict[str, Any] | None = None
        while True:
            if self.listeners:
                marks = await anyio.to_thread.run_sync(self.probe)
                self.probes += 1
                if last is not None and marks != last:
                    self.announce(sorted(key for key in marks if marks[key] != last.get(key)))
                last = marks
            else:
                last = None
            await anyio.sleep(self.interval)

    def announce(self, changed: list[str]) -> None:
        for listener in list(self.listeners):
            try:
                listener.send_nowait(changed)
            except anyio.WouldBlock:  # a page that reads nothing: it refreshes at its next reading
                pass
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.listeners.discard(listener)

    def close(self) -> None:
        """End every open stream, and any opened from now on, at once: the server is stopping.
        An open stream never ends by itself, so without this a page left open holds the shutdown
        until uvicorn's grace period runs out and cancels it (with a traceback per page)."""
        self.closed = True
        for listener in list(self.listeners):
            listener.close()
        self.listeners.clear()

    def stream(self, request: Request) -> StreamingResponse:
        """The server-sent event stream: `event: change` with the changed marks as a JSON list."""
        send, receive = anyio.create_memory_object_stream[list[str]](8)
        if self.closed:
            send.close()  # the page reconnects after `retry`, to the next server
        else:
            self.listeners.add(send)

        async def events() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\n: listening\n\n"
                while True:
                    changed: list[str] | None = None
                    with anyio.move_on_after(KEEPALIVE_S):
                        try:
                            changed = await receive.receive()
                        except anyio.EndOfStream:  # closed: the server is stopping
                            return
                    if changed is None:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"event: change\ndata: {json.dumps(changed)}\n\n"
            finally:
                self.listeners.discard(send)
                send.close()
                receive.close()

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)
