"""The Starlette application: its pages, its guard, its live loop, its templates and assets.

`create_app` is what `ledger web` serves and what tests drive through Starlette's TestClient.
Handlers are plain functions (Starlette runs them in its thread pool): the store is synchronous
SQLAlchemy, and a page is a handful of short queries.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import anyio
import jinja2
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ledger.settings import Settings
from ledger.store import Store
from ledger.store.browse import Count
from ledger.web.live import Live
from ledger.web.security import COOKIE, Guard, GuardMiddleware, safe_next
from ledger.web.spend import SpendHours

# How long a stopping server waits for the spend thread to finish the hour it is summing.
SPEND_STOP_S = 5.0

# Keys whose values a page never shows (a header or a parameter a stage may have passed along):
# these names, or names ending in one of them (`x-api-key`, `openai_api_key`, `client_secret`).
SECRET_KEYS = ("authorization", "api_key", "api-key", "apikey", "secret", "password", "access_token", "auth_token")


@dataclass(frozen=True)
class WebConfig:
    """What `ledger web` was started with. `hosts`: the Host header names accepted (None: any)."""

    allow_actions: bool = False
    token: str | None = None
    hosts: frozenset[str] | None = frozenset({"127.0.0.1", "localhost", "::1"})
    live_interval: float = 1.0


class Web:
    """What every page handler shares: the store, the settings, templates, the guard, the live loop."""

    def __init__(self, store: Store, settings: Settings, config: WebConfig) -> None:
        self.store = store
        self.settings = settings
        self.config = config
        self.guard = Guard.make(config.token, config.hosts)
        self.live = Live(store.change_marks, config.live_interval)
        self.spend = SpendHours(store)
        # Ended jobs' progress on `/jobs` and when it was summed, by (job id, its last update).
        self.ended_progress: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("ledger.web", "templates"),
            autoescape=True,  # everything a model or a stage wrote is text, never markup
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            when=when,
            money=money,
            count=count_text,
            pretty=pretty,
            number=number,
            seconds=seconds_text,
            seg=segment,
            ident=breakable,
        )
        self.env.globals.update(url=url, actions=config.allow_actions, csrf=self.guard.csrf())

    def render(self, request: Request, page: str, context: Mapping[str, Any], status: int = 200) -> HTMLResponse:
        """The page, or with `?fragment=NAME` just that fragment (what a live page fetches again)."""
        fragment = request.query_params.get("fragment")
        if fragment is not None:
            if not fragment.isidentifier():
                return HTMLResponse("no such fragment", status_code=404)
            try:
                template = self.env.get_template(f"fragments/{fragment}.html")
            except jinja2.TemplateNotFound:
                return HTMLResponse("no such fragment", status_code=404)
            return HTMLResponse(template.render(**context), status_code=status)
        return HTMLResponse(self.env.get_template(page).render(**context), status_code=status)

    def not_found(self, what: str) -> HTMLResponse:
        body = self.env.get_template("missing.html").render(what=what)
        return HTMLResponse(body, status_code=404)

    def login_page(self, next_path: str, failed: bool = False) -> bytes:
        return self.env.get_template("login.html").render(next=next_path, failed=failed).encode()


def create_app(store: Store, settings: Settings, config: WebConfig | None = None) -> Starlette:
    """The web view of `store`'s ledger."""
    from ledger.web import actions, pages_jobs, pages_overview, pages_requests

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


# -- what templates use --------------------------------------------------------------------------


def url(path: str, **params: Any) -> str:
    """One of our own URLs with its query string encoded (values a stage wrote included): the
    only way a page builds an href from data."""
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return path + ("?" + urlencode(kept) if kept else "")


def segment(value: Any) -> str:
    """A value as one URL path segment (a job id with a slash stays one segment)."""
    return quote(str(value), safe="")


# Where an identifier may break across lines: after these separators (browsers break after a
# hyphen or a space by themselves), never inside a word (`error_handling` is one).
IDENT_BREAKS = re.compile(r"(?<=[:/.@|])(?=.)")


def breakable(value: Any) -> Markup:
    """An identifier (custom_id, job, pool) as text a narrow column can wrap at its separators
    (`openai:` `gpt-` `4o-mini`) instead of mid-word: escaped, with <wbr> between the pieces."""
    return Markup("<wbr>").join(escape(piece) for piece in IDENT_BREAKS.split(str(value)))


def when(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)[:19]


def money(value: Any) -> str:
    return "" if value is None else f"${float(value):.4f}"


def number(value: Any) -> str:
    return "" if value is None else f"{int(value):,}"


def seconds_text(value: Any) -> str:
    if value is None:
        return ""
    s = int(value)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def count_text(value: Count) -> str:
    return f"{value.n:,}+" if value.capped else f"{value.n:,}"


def pretty(value: Any) -> str:
    """A JSON value as indented text, with secret-looking keys' values hidden."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(redact(value), indent=2, ensure_ascii=False, default=str)


def secret_key(key: object) -> bool:
    name = str(key).lower()
    return name in ("token", "bearer", "cookie") or name.endswith(SECRET_KEYS)


def redact(value: Any) -> Any:
    """A JSON value with the values of secret-looking keys, at any depth, replaced."""
    if isinstance(value, dict):
        return {k: "[hidden]" if secret_key(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def plain(text: str, status: int = 200) -> Response:
    return Response(text, status_code=status, media_type="text/plain; charset=utf-8")
