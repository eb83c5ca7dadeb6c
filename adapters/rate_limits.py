"""A provider's rate-limit headers in the ledger's words: what is left of its windows and when
they have room again (`RateLimits`), and the wait a refusal asks for (`retry_after_seconds`).

Kept apart from the call interface: the pools' pacing reads these and nothing else of an answer,
and an answer and a failure carry them alike.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any


@dataclass(frozen=True)
class RateLimits:
    """What a provider's rate-limit headers said with an answer (success or error).

    `remaining_*`: requests / tokens the provider will still accept in its current window
    (None: not said): `remaining_tokens` counts input and output together (OpenAI's, and
    Anthropic's combined limit), `remaining_input_tokens` / `remaining_output_tokens` are
    Anthropic's separate limits. `reset_*_s`: seconds until that window has room again.
    `call_tokens`: (input, output) tokens the provider counted for the call that brought
    these headers (`tokens_counted`), the best guess of what the next one costs.
    """

    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None
    remaining_input_tokens: int | None = None
    remaining_output_tokens: int | None = None
    call_tokens: tuple[int, int] | None = None
    limit_requests: int | None = None  # the requests the window holds when whole (`x-ratelimit-limit-requests`)

    @property
    def counts_tokens(self) -> bool:
        """Whether the headers said anything of a token window."""
        told = (self.remaining_tokens, self.remaining_input_tokens, self.remaining_output_tokens)
        return any(left is not None for left in told)

    def window(self) -> tuple[int, float] | None:
        """(calls the provider will still start, seconds until its window has room again), the
        tightest of requests and tokens; None when the headers gave no remaining count.

        Tokens left are turned into calls at `call_tokens`, each limit at its own part of a
        call's cost, so a token window slows the pool down before it is spent, not after.
        Without that guess (a 429 carries no usage), spent tokens still leave room for no
        call at all, whatever the requests count says."""
        found: list[tuple[int, float]] = []
        if self.remaining_requests is not None:
            found.append((max(self.remaining_requests, 0), self.reset_requests_s or 0.0))
        cost_in, cost_out = self.call_tokens or (0, 0)
        for left, per_call in (
            (self.remaining_tokens, cost_in + cost_out),
            (self.remaining_input_tokens, cost_in),
            (self.remaining_output_tokens, cost_out),
        ):
            if left is not None and per_call > 0:
                found.append((max(left, 0) // per_call, self.reset_tokens_s or 0.0))
            elif left is not None and left <= 0:
                found.append((0, self.reset_tokens_s or 0.0))
        if not found:
            return None
        remaining = min(n for n, _ in found)
        return remaining, max(s for n, s in found if n == remaining)


# Waits a server asks for, most precise first: its own (`retry-after-ms` is Azure's), then the
# upstream provider's as an OpenAI-compatible proxy passes them on (LiteLLM prefixes every header
# of the provider behind it with `llm_provider-`, and its 429s carry no `retry-after` of their own).
_RETRY_AFTER_HEADERS = (
    ("retry-after-ms", 0.001),
    ("retry-after", 1.0),
    ("llm_provider-retry-after-ms", 0.001),
    ("llm_provider-retry-after", 1.0),
)


def retry_after_seconds(headers: Any) -> float | None:
    """The wait a refusal asks for, in seconds: `retry-after-ms`, `retry-after`, or the same two
    prefixed `llm_provider-` by a proxy (HTTP dates are ignored)."""
    if headers is None:
        return None
    for name, scale in _RETRY_AFTER_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except (TypeError, ValueError):
            continue
    return None


# OpenAI: `x-ratelimit-remaining-requests: 59`, `x-ratelimit-reset-requests: 1s` (also `6m0s`,
# `20ms`). Anthropic: `anthropic-ratelimit-requests-remaining: 49`, `...-reset: <RFC 3339 time>`,
# and for tokens also the input / output token variants (the tightest one counts).
_RESETS = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def read_rate_limits(headers: Any) -> RateLimits | None:
    """The rate-limit headers of an answer, OpenAI's or Anthropic's; None when it has none."""
    if headers is None:
        return None
    # Read once into a plain dict (an httpx `Headers`' items: lower-case names, repeated ones
    # joined as its `get` joins them): its `get` scans every header for each of the thirteen
    # names asked, 2 us each, on every answer.
    headers = dict(headers.items())
    requests = _least(headers, "x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining")
    tokens = _least(headers, "x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining")
    input_tokens = _least(headers, "anthropic-ratelimit-input-tokens-remaining")
    output_tokens = _least(headers, "anthropic-ratelimit-output-tokens-remaining")
    if requests is None and tokens is None and input_tokens is None and output_tokens is None:
        return None
    return RateLimits(
        remaining_requests=requests,
        remaining_tokens=tokens,
        remaining_input_tokens=input_tokens,
        remaining_output_tokens=output_tokens,
        reset_requests_s=_latest_reset(headers, "x-ratelimit-reset-requests", "anthropic-ratelimit-requests-reset"),
        limit_requests=_least(headers, "x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"),
        reset_tokens_s=_latest_reset(
            headers,
            "x-ratelimit-reset-tokens",
            "anthropic-ratelimit-tokens-reset",
            "anthropic-ratelimit-input-tokens-reset",
            "anthropic-ratelimit-output-tokens-reset",
        ),
    )


def _least(headers: Any, *names: str) -> int | None:
    found = []
    for name in names:
        value = headers.get(name)
        if value is not None:
            try:
                found.append(int(float(value)))
            except (TypeError, ValueError):
                continue
    return min(found) if found else None


def _latest_reset(headers: Any, *names: str) -> float | None:
    found = [s for s in (reset_seconds(headers.get(name)) for name in names) if s is not None]
    return max(found) if found else None


def reset_seconds(value: str | None) -> float | None:
    """Seconds until a reset: OpenAI's durations (`1s`, `6m0s`, `20ms`, `0.5s`), a bare number
    of seconds, or Anthropic's RFC 3339 / HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parts = _RESETS.findall(value)
    if parts and "".join(n + u for n, u in parts) == value:
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())
