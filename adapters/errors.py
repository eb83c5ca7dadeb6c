"""A failed call, classified once by the adapter that understands the provider (`ProviderError`:
whether a retry can help, whether the account's quota is spent), and the rules every adapter
shares to classify one: which HTTP statuses are transient, a spent quota or balance, an error in
a 200 body, an SDK's failure to connect worded without a key.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from adapters.rate_limits import RateLimits, read_rate_limits, retry_after_seconds

# Transient by nature: timeouts, rate limits, server and gateway errors, Anthropic's 529 "overloaded".
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 529})


class ProviderError(Exception):
    """A failed call, classified once by the adapter that understands the provider."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool,
        code: str = "provider_error",
        retry_after: float | None = None,
        limits: RateLimits | None = None,
        quota: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.code = code
        self.retry_after = retry_after
        self.limits = limits  # the provider's rate-limit headers, when it sent any
        # The account's quota or balance is spent (why, in one line): no retry fixes it soon, and
        # every request of the pool would be refused alike. The pool is paused, not the request
        # failed (`ledger.executor`).
        self.quota = quota
        # How long the pause lasts, when the provider says when its quota resets (Gemini's per-day
        # quotas: its midnight); None: the operator's recheck period.
        self.quota_for: float | None = None
        # A batch refused at create: which entries the provider named (see BatchRejection).
        self.rejections: tuple[BatchRejection, ...] = ()


@dataclass(frozen=True)
class BatchRejection:
    """A validation error of a whole batch; `line` (0-based) when the provider names one."""

    line: int | None
    code: str
    message: str


@contextmanager
def sdk_errors(
    sdk: ModuleType,
    *,
    message: Callable[[Any], str] | None = None,
    rejections: Callable[[Any], tuple[BatchRejection, ...]] | None = None,
) -> Iterator[None]:
    """Turn the official SDKs' HTTP failures (`openai` and `anthropic` name them alike) into
    `ProviderError`s with the ledger's retry rules. `message` words a status error (default
    "STATUS: message"); `rejections` reads which batch entries a refused create named."""
    try:
        yield
    except sdk.APIStatusError as exc:
        text = message(exc) if message is not None else f"{exc.status_code}: {exc.message}"
        failure = classify_status(exc.status_code, text, exc.body, exc.response.headers)
        if rejections is not None:
            failure.rejections = rejections(exc)
        raise failure from None
    except sdk.APITimeoutError:
        raise ProviderError("request timed out", retryable=True, code="timeout") from None
    except sdk.APIConnectionError as exc:
        raise ProviderError(connection_failure(exc), retryable=True, code="connection_error") from None


def connection_failure(exc: BaseException) -> str:
    """`connection error: cannot connect to URL (connection refused)`: where the call went and
    why it failed, from the exception and its causes (the SDKs' own message is only
    "Connection error."). The URL is kept without its query and user part, and no header is
    read: the message is stored with the attempt, and a key must never be."""
    request = None
    with suppress(RuntimeError, AttributeError):  # httpx raises RuntimeError for an exception without one
        request = exc.request  # type: ignore[attr-defined]
    url = _url_shown(str(request.url)) if request is not None else None
    chain, seen = [], set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    reason = _connection_reason(chain[1:] or chain)
    connecting = any(type(c).__name__ == "ConnectError" for c in chain)
    if url is None:
        return f"connection error: {reason}"
    if connecting:
        return f"connection error: cannot connect to {url} ({reason})"
    return f"connection error: {url}: {reason}"


def _url_shown(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{host}{port}", parts.path, "", ""))


def _connection_reason(chain: list[BaseException]) -> str:
    """The deepest cause that says something: an OS error by its errno's words (`connection
    refused`), a name that did not resolve, or the last message given."""
    for cause in reversed(chain):
        if isinstance(cause, socket.gaierror):
            return f"host not found: {cause.strerror or cause}"
        if isinstance(cause, OSError) and cause.errno:
            return os.strerror(cause.errno).lower()
    said = [" ".join(str(c).split()) for c in chain if str(c).strip()]
    return said[-1] if said else type(chain[-1]).__name__


def malformed(what: str, status_code: int) -> ProviderError:
    """An answer the provider sent but the ledger cannot read: a transient fault, tried again."""
    return ProviderError(what, status_code=status_code, retryable=True, code="malformed_response")


def raise_error_in_body(data: Any, status_code: int) -> None:
    """A body that carries an error instead of an answer (a 200 from a proxy or a compatible
    server, say) is a failure, classified by the upstream status it names (else 502)."""
    if not isinstance(data, dict) or not data.get("error"):
        return
    error = data["error"] if isinstance(data["error"], dict) else {"message": str(data["error"])}
    upstream = error.get("code")
    status = upstream if isinstance(upstream, int) and 400 <= upstream < 600 else 502
    failure = classify_status(status, f"error in a {status_code} body: {error.get('message', '')}", data)
    failure.code = "error_in_body"
    raise failure


def classify_status(status_code: int, message: str, body: Any = None, headers: Any = None) -> ProviderError:
    """Turn an HTTP error status into a ProviderError with the ledger's retry rules.

    A spent quota or balance will not clear by retrying soon: OpenAI's 429 `insufficient_quota`,
    Anthropic's 400 saying the credit balance is too low. Neither is retried; both carry the
    reason (`quota`) that pauses the pool. Every other 429 is retried.
    """
    code = _error_code(body) or f"http_{status_code}"
    retryable = status_code in RETRYABLE_STATUS
    quota = spent_quota(status_code, code, message)
    if quota is not None:
        retryable, code = False, "insufficient_quota" if status_code == 429 else "credit_balance_too_low"
    return ProviderError(
        message,
        status_code=status_code,
        retryable=retryable,
        code=code,
        retry_after=retry_after_seconds(headers),
        limits=read_rate_limits(headers),
        quota=quota,
    )


def spent_quota(status_code: int, code: str, message: str) -> str | None:
    """Why an error means the account can pay for no more calls (None: it does not)."""
    if status_code == 429 and code == "insufficient_quota":
        return f"quota exhausted (insufficient_quota): {message}"[:300]
    if status_code == 400 and "credit balance is too low" in message.lower():
        return f"credit balance too low: {message}"[:300]
    return None


def _error_code(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error", body)
    if isinstance(error, dict):
        for key in ("code", "type"):
            if isinstance(error.get(key), str):
                return str(error[key])
    return None
