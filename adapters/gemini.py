"""Gemini through the official `google-genai` SDK, with its retries off (it makes one attempt when
given no retry options).

The request is written in Gemini's wire format (`gemini_format`) and handed to the SDK's typed
`generate_content`, which asks for the raw HTTP answer (`should_return_http_response`): the body
is kept as received, and read once here.

Gemini says "slow down" and "no more today" with the same 429 `RESOURCE_EXHAUSTED`; its details
tell them apart. A `QuotaFailure` naming a per-day quota is spent until the provider's daily reset
(midnight in America/Los_Angeles): the pool pauses until then. Any other 429 is an ordinary one,
its `RetryInfo.retryDelay` honoured like a Retry-After header and read as the pool's window
(nothing left in it until then).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
import httpx2
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from adapters.base import CallRequest, CallResult, json_body
from adapters.errors import ProviderError, classify_status, connection_failure, malformed, raise_error_in_body
from adapters.gemini_format import content_result, wire_request
from adapters.rate_limits import RateLimits

# Where Gemini's daily quotas reset (https://ai.google.dev/gemini-api/docs/rate-limits).
QUOTA_DAY_ZONE = "America/Los_Angeles"
_TYPE = "type.googleapis.com/google.rpc."
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def gemini_client(api_key: str | None, base_url: str | None) -> genai.Client:
    """The SDK's client for the Gemini Developer API, no retries of its own; the key goes to it
    and nowhere else (never logged, never stored)."""
    options = genai_types.HttpOptions(base_url=base_url) if base_url else None
    # Never Vertex AI, whatever GOOGLE_GENAI_USE_VERTEXAI says: provider `gemini` is the Developer API.
    return genai.Client(vertexai=False, api_key=api_key or "not-needed", http_options=options)


class GeminiAdapter:
    name = "gemini"

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        self._client = gemini_client(api_key, base_url)

    @property
    def supports_structured_output(self) -> bool:
        return True  # `responseJsonSchema`: structured batching of dimensions works on Gemini

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        body = wire_request(request)
        config = request_config(body, {"timeout": max(int(timeout * 1000), 1)})
        config["shouldReturnHttpResponse"] = True
        with gemini_errors():
            response = await self._client.aio.models.generate_content(
                model=request.model,
                contents=body["contents"],
                config=genai_types.GenerateContentConfig.model_validate(config),
            )
        raw = response.sdk_http_response
        text = (raw.body if raw is not None else None) or ""
        data = json_body(text, 200)
        raise_error_in_body(data, 200)
        if not isinstance(data, dict) or not ("candidates" in data or "promptFeedback" in data):
            raise malformed("response has neither candidates nor promptFeedback", 200)
        return content_result(data, 200, text)

    async def aclose(self) -> None:
        await self._client.aio.aclose()


def request_config(body: dict[str, Any], http_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A wire request's parts besides `contents`, as the SDK's `GenerateContentConfig` takes them
    (its fields are `generationConfig`'s, flattened, beside the request's own)."""
    config: dict[str, Any] = dict(body.get("generationConfig") or {})
    for key, value in body.items():
        if key not in ("contents", "generationConfig"):
            config[key] = value
    if http_options is not None:
        config["httpOptions"] = http_options
    return config


@contextmanager
def gemini_errors() -> Iterator[None]:
    """The SDK's failures as `ProviderError`s with the ledger's retry rules."""
    try:
        yield
    except genai_errors.APIError as exc:
        headers = getattr(exc.response, "headers", None)
        raise gemini_failure(int(exc.code or 500), exc.status, exc.message or "", exc.details, headers) from None
    except (httpx.TimeoutException, httpx2.TimeoutException):
        raise ProviderError("request timed out", retryable=True, code="timeout") from None
    except (httpx.TransportError, httpx2.TransportError) as exc:
        raise ProviderError(connection_failure(exc), retryable=True, code="connection_error") from None


def gemini_failure(code: int, status: str | None, message: str, body: Any, headers: Any = None) -> ProviderError:
    """An error answer (`{"error": {"code", "message", "status", "details"}}`) classified: a spent
    per-day quota pauses the pool until the daily reset; any other 429 is retried after its
    `RetryInfo` delay."""
    failure = classify_status(code, f"{code} {status or ''}: {message}".replace(" :", ":"), None, headers)
    if status:
        failure.code = status.lower()
    details = error_details(body)
    if code != 429:
        return failure
    violations = [v for d in details if d.get("@type") == _TYPE + "QuotaFailure" for v in d.get("violations") or []]
    daily = next((v for v in violations if "PerDay" in str(v.get("quotaId") or "")), None)
    if daily is not None:
        failure.retryable = False
        failure.quota = f"daily quota exhausted ({daily.get('quotaId')}): {message}"[:300]
        failure.quota_for = seconds_to_quota_day_end()
        return failure
    delay = next((retry_delay(d) for d in details if d.get("@type") == _TYPE + "RetryInfo"), None)
    if delay is not None:
        failure.retry_after = delay
        failure.limits = RateLimits(remaining_requests=0, reset_requests_s=delay)
    return failure


def error_details(body: Any) -> list[dict[str, Any]]:
    error = body.get("error", body) if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def retry_delay(detail: dict[str, Any]) -> float | None:
    """`RetryInfo.retryDelay` (a protobuf Duration as JSON: "17s", "0.5s") in seconds."""
    found = _DURATION.match(str(detail.get("retryDelay") or ""))
    return float(found.group(1)) if found else None


def seconds_to_quota_day_end(now: datetime | None = None) -> float:
    """Seconds until the next midnight in Gemini's quota day (America/Los_Angeles)."""
    try:
        zone: Any = ZoneInfo(QUOTA_DAY_ZONE)
    except ZoneInfoNotFoundError:  # no time zone database: Pacific standard time, at worst an hour late
        zone = timezone(timedelta(hours=-8))
    here = (now or datetime.now(UTC)).astimezone(zone)
    midnight = (here + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max((midnight.astimezone(UTC) - here.astimezone(UTC)).total_seconds(), 1.0)
