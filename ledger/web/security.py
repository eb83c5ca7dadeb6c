"""What keeps the web view safe to leave running: a Host check (DNS rebinding), the token (a login
cookie, or `Authorization: Bearer` for scripts), CSRF tokens on actions, and headers that forbid
inline script and framing.

Plain ASGI middleware (not Starlette's BaseHTTPMiddleware) so a server-sent event stream passes
through untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "ledger_web"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Paths answered without the token: the login form itself and the static assets it uses.
OPEN_PATHS = ("/login", "/static/")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]


def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8 or ::1."""
    if host.strip("[]") in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bound: str) -> frozenset[str] | None:
    """The Host header names a client may use for a server bound to `bound`; None: any (a wildcard
    bind, 0.0.0.0 or ::, answers on every address of the machine, and then the token, required
    off loopback, is what guards it)."""
    name = bound.strip("[]").lower()
    if name in ("0.0.0.0", "::", ""):
        return None
    if is_loopback(name):
        return LOOPBACK_NAMES | {name}
    return frozenset({name})


def host_name(header: str) -> str:
    """The name part of a Host header (`[::1]:8765` -> `::1`, `example.org:80` -> `example.org`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class Guard:
    """The running server's secrets: the token (None: none required), and a random key per process
    that CSRF tokens and the login cookie are derived from."""

    token: str | None
    key: bytes
    hosts: frozenset[str] | None

    @classmethod
    def make(cls, token: str | None, hosts: Iterable[str] | None) -> Guard:
        return cls(token or None, secrets.token_bytes(32), None if hosts is None else frozenset(hosts))

    def cookie_value(self) -> str:
        """The login cookie: a digest of the token (the token itself never sits in a cookie jar)."""
        assert self.token is not None
        return hmac.new(self.key, b"login:" + self.token.encode(), hashlib.sha256).hexdigest()

    def csrf(self) -> str:
        return hmac.new(self.key, b"csrf", hashlib.sha256).hexdigest()

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf())

    def token_ok(self, given: str | None) -> bool:
        return self.token is not None and given is not None and hmac.compare_digest(given, self.token)

    def signed_in(self, headers: dict[str, str]) -> bool:
        if self.token is None:
            return True
        auth = headers.get("authorization", "")
        if auth.lower().startswith("bearer ") and self.token_ok(auth[7:].strip()):
            return True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except Exception:  # a malformed Cookie header signs nobody in
            return False
        morsel = cookie.get(COOKIE)
        return morsel is not None and hmac.compare_digest(morsel.value, self.cookie_value())


class GuardMiddleware:
    """Host check, then the token, then the response headers, on every HTTP request."""

    def __init__(self, app: ASGIApp, guard: Guard, login_page: Any) -> None:
        self.app = app
        self.guard = guard
        self.login_page = login_page  # (path) -> bytes: the login form, the 401's body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *HEADERS]
            await send(message)

        hosts = self.guard.hosts
        if hosts is not None and host_name(headers.get("host", "")) not in hosts:
            await _plain(with_headers, 421, b"unknown Host: this server answers to its own address only\n")
            return
        path = str(scope.get("path", "/"))
        if not path.startswith(OPEN_PATHS) and not self.guard.signed_in(headers):
            query = scope.get("query_string", b"").decode("latin-1")
            body: bytes = self.login_page(path + ("?" + query if query else ""))
            await _plain(with_headers, 401, body, b"text/html; charset=utf-8")
            return
        await self.app(scope, receive, with_headers)


async def _plain(send: Send, status: int, body: bytes, kind: bytes = b"text/plain; charset=utf-8") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def safe_next(target: str | None) -> str:
    """Where a login goes back to: a path of this server only (never `//host` or a scheme)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
