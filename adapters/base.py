"""The one small interface between the ledger and a provider.

Like httpx's transport seam: the ledger hands an adapter a provider-neutral
request and gets back text and usage, or a `ProviderError` that already says
whether a retry can help. Everything a provider does differently (wire format,
where the system prompt goes, which errors are transient) stays behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# Transient by nature (seed 000 FR-002, plus 500 and Anthropic's 529 "overloaded").
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 529})


@dataclass(frozen=True)
class CallRequest:
    """A request as stored in the ledger: system text, messages, params, response format."""

    model: str
    messages: list[dict[str, Any]]
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class CallResult:
    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    status_code: int = 200


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
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.code = code
        self.retry_after = retry_after


class Adapter(Protocol):
    """What the executor needs from a provider."""

    name: str

    @property
    def supports_structured_output(self) -> bool: ...

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        """Make one attempt. Raise `ProviderError` on failure; never retry internally."""
        ...

    async def aclose(self) -> None: ...


def retry_after_seconds(headers: Any) -> float | None:
    """Read `retry-after-ms` or `retry-after` (seconds; HTTP dates are ignored)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except (TypeError, ValueError):
            continue
    return None


def classify_status(status_code: int, message: str, body: Any = None, headers: Any = None) -> ProviderError:
    """Turn an HTTP error status into a ProviderError with the ledger's retry rules.

    A 429 whose body says the quota is exhausted (`insufficient_quota`) will not
    clear by waiting, so it is not retried; every other 429 is.
    """
    code = _error_code(body) or f"http_{status_code}"
    retryable = status_code in RETRYABLE_STATUS
    if status_code == 429 and code == "insufficient_quota":
        retryable = False
    return ProviderError(
        message,
        status_code=status_code,
        retryable=retryable,
        code=code,
        retry_after=retry_after_seconds(headers),
    )


def _error_code(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error", body)
    if isinstance(error, dict):
        for key in ("code", "type"):
            if isinstance(error.get(key), str):
                return str(error[key])
    return None
