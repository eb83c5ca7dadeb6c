"""The Starlette application: the pages, the login, the live loop, the assets and the spend thread,
composed.

`create_app` is what `ledger web` serves and what tests drive through Starlette's TestClient.
Handlers are plain functions (Starlette runs them in its thread pool): the store is synchronous
SQLAlchemy, and a page is a handful of short queries.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ledger.settings import Settings
from ledger.store import Store
from ledger.web import actions, pages_jobs, pages_overview, pages_requests
from ledger.web.base import Web, WebConfig
from ledger.web.security import COOKIE, GuardMiddleware, safe_next

# How long a stopping server waits for the spend thread to finish the hour it is summing.
SPEND_STOP_S = 5.0


def create_app(store: Store, settings: Settings, config: WebConfig | None = None) -> Starlette:
    """The web view of `store`'s ledger."""
    web = Web(store, settings, config or WebConfig())
    routes: list[BaseRoute] = [
        *pages_overview.routes(web),
        *pages_jobs.routes(web),
        *pages_requests.routes(web),
        *actions.routes(web),
        Route("/login", login_routes(web), methods=["GET", "POST"]),
        Route("/events", web.live.stream),
        Mount("/static", app=StaticFiles(packages=[("ledger.web", "static")]), name="static"),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        stop = threading.Event()
        filler = threading.Thread(target=web.spend.fill, args=(stop,), name="ledger-web-spend", daemon=True)
        filler.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(web.live.run)
                yield
                tg.cancel_scope.cancel()
        finally:
            # The thread stops with the server, not after it: a store closed (or a test's schema
            # dropped) under a thread still summing would be read by it.
            stop.set()
            await anyio.to_thread.run_sync(filler.join, SPEND_STOP_S)

    app = Starlette(
        routes=routes,
        middleware=[Middleware(GuardMiddleware, guard=web.guard, login_page=web.login_page)],
        lifespan=lifespan,
    )
    app.state.web = web
    return app


def login_routes(web: Web) -> Any:
    """GET: the form; POST: the token checked, then the login cookie (HttpOnly, SameSite=Strict: a
    browser's event stream cannot send an Authorization header, a cookie it sends)."""

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return HTMLResponse(web.login_page(safe_next(request.query_params.get("next"))))
        form = await request.form()
        token, target = form.get("token"), form.get("next")
        back = safe_next(target if isinstance(target, str) else None)
        if web.guard.token is None:
            return RedirectResponse(back, status_code=303)
        if not web.guard.token_ok(token if isinstance(token, str) else None):
            return HTMLResponse(web.login_page(back, failed=True), status_code=401)
        response = RedirectResponse(back, status_code=303)
        response.set_cookie(COOKIE, web.guard.cookie_value(), httponly=True, samesite="strict", path="/")
        return response

    return login
