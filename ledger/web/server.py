"""`ledger web`: bind, say where (the first line on stdout), serve until stopped.

The socket is bound here, before uvicorn starts, so the first line can name the port actually
taken (`--port 0`) and is printed before anything can connect. SIGINT (Ctrl-C) and SIGTERM stop
it at once and quietly, with exit status 0 (`WebServer`).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ledger.settings import Settings
from ledger.store import Store
from ledger.web.app import create_app
from ledger.web.base import WebConfig
from ledger.web.live import Live
from ledger.web.security import allowed_hosts, is_loopback

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class WebRefused(Exception):
    """What an operator must fix before the server can start (one line, exit 2)."""


def check_host(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise WebRefused(
            f"ledger web: --host {host} is reachable from other machines: set LEDGER_WEB_TOKEN "
            "(every request must then carry it), or bind 127.0.0.1"
        )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise WebRefused(f"ledger web: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def address(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def web_server(config: Any, live: Live) -> Any:
    """uvicorn's server, stopping as `ledger web` should (uvicorn is imported only when serving)."""
    import uvicorn

    class WebServer(uvicorn.Server):
        """Ends the pages' event streams first when it stops: they never end by themselves, and
        uvicorn would wait out its grace period for them, then cancel each with a traceback. A
        stop that was asked for (Ctrl-C, SIGTERM) is no failure: the process exits 0, where
        uvicorn would raise the signal again once stopped (exit 130 or 143). A second Ctrl-C
        still forces the stop."""

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            live.close()
            await super().shutdown(sockets=sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return WebServer(config)


def serve(settings: Settings, *, host: str, port: int, allow_actions: bool, token: str | None) -> None:
    """Serve until SIGINT / SIGTERM."""
    import uvicorn

    check_host(host, token)
    store = Store(settings.database_url)
    sock = bind(host, port)
    config = WebConfig(allow_actions=allow_actions, token=token, hosts=allowed_hosts(host))
    app = create_app(store, settings, config)
    sys.stdout.write(f"ledger web: {address(host, sock.getsockname()[1])}\n")
    sys.stdout.flush()
    server = web_server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
            server_header=False,
        ),
        app.state.web.live,
    )
    try:
        server.run(sockets=[sock])
    finally:
        store.close()
