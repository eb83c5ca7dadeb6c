"""What every page of the web view builds on: `WebConfig` (how `ledger web` was started), `Web` (the
store, the settings, the templates, the guard, the live loop, shared by every handler) and the
helpers handlers use to read a parameter and answer plain text.

The page modules import from here and `app` imports the page modules, so the imports run one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ledger.settings import Settings
from ledger.store import Store
from ledger.web.formats import breakable, count_text, money, number, pretty, seconds_text, segment, url, when
from ledger.web.live import Live
from ledger.web.security import Guard
from ledger.web.spend import SpendHours


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
