"""The one small interface between the ledger and a provider.

Like httpx's transport seam: the ledger hands an adapter a provider-neutral
request and gets back text and usage, or a `ProviderError` that already says
whether a retry can help. Everything a provider does differently (wire format,
where the system prompt goes, which errors are transient) stays behind it.
"""

from __future__ import annotations

import json
import json.scanner
import math
import os
import re
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson

# Transient by nature (seed 000 FR-002, plus 500 and Anthropic's 529 "overloaded").
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 529})
_READ_BYTES = 64 * 1024  # a streamed result file is read this much at a time


@dataclass(frozen=True)
class CallRequest:
    """A request as stored in the ledger: system, messages, params, response format. Messages
    and their parts are as the caller wrote them (OpenAI's, Anthropic's or Gemini's words); the
    system is text, or Anthropic's system blocks as given."""

    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    api: str | None = None  # chat | responses | messages; None: the provider's usual one


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


# Why an answer ended, in the ledger's words (each adapter maps its provider's own word here,
# and keeps that word as `provider_finish_reason`).
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "refusal", "other")


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for: `arguments` is the exact JSON text it produced (Anthropic's
    `tool_use` input, which arrives as an object, serialised with sorted keys)."""

    id: str
    name: str
    arguments: str

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(slots=True)  # not frozen: built per mapped line, and a frozen __init__ costs three times as much
class CallResult:
    """One answer, whole: its text (`raw_output`: text blocks joined, "" for an answer that is
    only a tool call), the provider-neutral fields derived from its body, the usage in full, and
    the body itself as received (`response`, the parsed JSON, never changed).

    `input_tokens` is every input token the model read (cached ones and cache writes included);
    `cached_input_tokens` and `cache_write_tokens` are the parts of it billed at other rates;
    `reasoning_tokens` the part of `output_tokens` spent thinking."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    status_code: int = 200
    limits: RateLimits | None = None  # the provider's rate-limit headers, when it sent any
    finish_reason: str | None = None  # one of FINISH_REASONS
    provider_finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    refusal: str | None = None
    thinking: str | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    response: Any = None
    response_text: str | None = None  # the body's JSON text exactly as received, where the adapter has it
    # The price table entry that prices this answer, when it is not the request's own provider and
    # model: Azure's model is a deployment name of the user's, its answer names the real model.
    priced_as: tuple[str, str] | None = None


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


class Adapter(Protocol):
    """What the executor needs from a provider."""

    name: str

    @property
    def supports_structured_output(self) -> bool: ...

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        """Make one attempt. Raise `ProviderError` on failure; never retry internally."""
        ...

    async def aclose(self) -> None: ...


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


async def nonblank_lines(opened: AbstractAsyncContextManager[Any]) -> AsyncGenerator[bytes, None]:
    """The non-blank lines of a streamed download (an SDK's `with_streaming_response` call),
    read as they arrive: a result file is never whole in memory.

    Lines are split from the raw bytes, not decoded to text first: JSONL is UTF-8 and
    `json.loads` takes bytes, and the SDK's text line decoder was a fifth of the time
    spent mapping a 100,000-line result file (issue 10)."""
    async with opened as response:
        partial: list[bytes] = []  # the line being read, in pieces: a long one is joined once
        async for chunk in response.iter_bytes(_READ_BYTES):
            if b"\n" not in chunk:
                partial.append(chunk)
                continue
            lines = chunk.split(b"\n")
            lines[0] = b"".join([*partial, lines[0]])
            partial = [lines.pop()]
            for line in lines:
                if line.strip():
                    yield line
        rest = b"".join(partial)
        if rest.strip():
            yield rest


_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # the C scanner: (value, end) from an index


# A run of 19 digits, found as a run of zeros once every digit is one (a regular expression
# took five times as long).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_DIGITS = b"0" * 19


def json_and_text_at(line: str | bytes, path: tuple[str, ...]) -> tuple[Any, str | None]:
    """A JSON document parsed, and the value at `path` (object keys) as JSON text: a batch result
    line's answer body, for the store to write as it is (the body is never parsed or written out
    again on the way to the database).

    orjson parses the line and writes the value out again (the same JSON, compact: a tenth of
    what the json module took to find the value's span and parse around it, which was a third of
    the event loop's time per mapped line). A document orjson refuses (a lone surrogate escape,
    NaN) goes to `_json_and_span_at`, which keeps the value's text as it
    stands in the document; so does one with a run of 19 digits or more, which might be an
    integer orjson would read as a float."""
    if _NINETEEN_DIGITS in (line if isinstance(line, bytes) else line.encode()).translate(_DIGITS_AS_ZERO):
        return _json_and_span_at(line, path)
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return _json_and_span_at(line, path)
    node = obj
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return obj, None
    return obj, orjson.dumps(node).decode()


def _json_and_span_at(line: str | bytes, path: tuple[str, ...]) -> tuple[Any, str | None]:
    """`json_and_text_at` with the json module, the value's text as it stands in the document.

    The value is parsed where its key is found, the rest of the document with a `null` in its
    place; then the rest must hold that `null` at `path`, or the key found was another one (in a
    string, in another object) and the document is parsed plainly (text None). Either way every
    byte is parsed once."""
    text = line.decode("utf-8") if isinstance(line, bytes) else line
    marker = json.dumps(path[-1])
    at = text.find(marker)
    while at != -1:
        colon = at + len(marker)
        while colon < len(text) and text[colon] in " \t\r\n":
            colon += 1
        if colon < len(text) and text[colon] == ":":
            start = colon + 1
            while start < len(text) and text[start] in " \t\r\n":
                start += 1
            try:
                value, end = _SCAN(text, start)
                rest = json.loads(text[:start] + "null" + text[end:])
            except (ValueError, StopIteration):
                break
            node = rest
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and path[-1] in node and node[path[-1]] is None:
                node[path[-1]] = value
                return rest, text[start:end]
            break
        at = text.find(marker, at + 1)
    return json.loads(text), None


def compact_json(obj: Any) -> bytes:
    """One batch input entry: JSON without spaces, UTF-8 as is (input files are sized in bytes)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


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


def tokens_counted(result: CallResult, max_tokens: Any) -> tuple[int, int] | None:
    """(input, output) tokens a provider counts against its token windows for an answered call.
    Both estimate a call when they admit it from its prompt and the `max_tokens` it asks for
    (Anthropic's documentation says it adjusts the output part to the usage afterwards), so
    that is what the next call must find room for; a request without `max_tokens` is counted
    by its usage. None when the answer reported no usage."""
    if result.input_tokens is None and result.output_tokens is None:
        return None
    asked = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
    return result.input_tokens or 0, max_tokens if asked else (result.output_tokens or 0)


def with_rate_limits(result: CallResult, headers: Any, max_tokens: Any) -> CallResult:
    """An answer with its rate-limit headers and what the provider counted for it against its
    token windows (`tokens_counted`, from the `max_tokens` the request sent); the answer as it
    is when it came with no such headers."""
    limits = read_rate_limits(headers)
    if limits is None:
        return result
    return replace(result, limits=replace(limits, call_tokens=tokens_counted(result, max_tokens)))


def read_rate_limits(headers: Any) -> RateLimits | None:
    """The rate-limit headers of an answer, OpenAI's or Anthropic's; None when it has none."""
    if headers is None:
        return None
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


def finish_reason(word: Any, table: dict[str, str]) -> str | None:
    """A provider's word for why an answer ended, in the ledger's (`FINISH_REASONS`): from the
    adapter's `table`, "other" for a word it does not know, None when the provider said none."""
    if not isinstance(word, str) or not word:
        return None
    return table.get(word, "other")


def arguments_text(value: Any) -> str:
    """A tool call's arguments as JSON text: as the model wrote them when they came as text (an
    OpenAI function call), else the object serialised with sorted keys (Anthropic's `input`)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def joined(parts: list[str]) -> str | None:
    """Text pieces of one kind (thinking blocks, refusals) as one text; None when there are none."""
    found = [part for part in parts if part]
    return "\n\n".join(found) if found else None


def token_count(value: Any) -> int | None:
    """A usage count as a provider sent it, as a whole number: some OpenAI-compatible servers
    send `12.0`, which PostgreSQL's integer columns refuse; anything not a number is unknown."""
    if type(value) is int:  # the usual case, first: a batch's results read four of these a line
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(value)


def malformed(what: str, status_code: int) -> ProviderError:
    """An answer the provider sent but the ledger cannot read: a transient fault, tried again."""
    return ProviderError(what, status_code=status_code, retryable=True, code="malformed_response")


def json_body(text: str, status_code: int) -> Any:
    """An answer's body as JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise malformed(f"malformed response body ({len(text)} bytes, not JSON)", status_code) from None


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


# -- provider batch jobs ---------------------------------------------------------------


@dataclass(frozen=True)
class BatchLayout:
    """How a provider's batch input is laid out on disk: `head`, one encoded entry per
    request joined by `sep`, `tail`. Lets the ledger build the input streaming and know
    its exact size before it is written."""

    head: bytes
    sep: bytes
    tail: bytes

    def size(self, entries: int, entry_bytes: int) -> int:
        return len(self.head) + entry_bytes + len(self.sep) * max(entries - 1, 0) + len(self.tail)


@dataclass(frozen=True)
class BatchTag:
    """What names a ledger batch at the provider: carried in metadata where the provider has it."""

    ledger_batch_id: int
    submit_key: str


@dataclass(frozen=True)
class BatchRejection:
    """A validation error of a whole batch; `line` (0-based) when the provider names one."""

    line: int | None
    code: str
    message: str


@dataclass(frozen=True)
class ProviderBatch:
    """A provider batch job as last read, in the ledger's words.

    `state` is one of in_progress, completed, expired, canceled, failed: `ended` once
    no further change will come and results (if any) can be read. `status` keeps the
    provider's own word (`cancelling` is not `cancelled`).
    """

    id: str
    status: str
    state: str
    total: int | None
    counts: dict[str, int]
    created_at: float | None = None
    tag: BatchTag | None = None
    rejections: tuple[BatchRejection, ...] = ()
    output_file_id: str | None = None
    error_file_id: str | None = None
    input_file_id: str | None = None

    @property
    def ended(self) -> bool:
        return self.state != "in_progress"


@dataclass(slots=True)  # not frozen: built per mapped line, and a frozen __init__ costs three times as much
class BatchLine:
    """One request's result in a batch's output, found by its `custom_id`.

    `kind`: succeeded, failed (the request's own error: follows the retry policy),
    expired or canceled (the batch ended before reaching it: no answer, not counted).
    """

    custom_id: str
    kind: str
    answer: CallResult | None = None  # succeeded: the answer, whole
    status_code: int | None = None
    error_code: str | None = None
    message: str | None = None
    retryable: bool = False


class ReconcileLater(Exception):
    """Candidates for a batch created before a crash exist but cannot be told apart yet."""


class BatchAdapter(Protocol):
    """What the provider-batch stage needs from a provider with a batch API.

    Submission is split so the ledger can record each step before the next:
    `upload` (a file id to store before `create`), then `create`. `find` looks
    for a batch the provider accepted before a crash kept the ledger from
    recording it; `results` streams an ended batch's lines, never whole in memory.
    """

    name: str
    max_requests: int
    max_bytes: int
    layout: BatchLayout
    uploads_input: bool  # the input is uploaded as a file (its id stored) before the create call

    def encode(self, custom_id: str, request: CallRequest) -> bytes:
        """One entry of the input (without separators)."""
        ...

    async def upload(self, path: Path) -> str | None: ...

    async def create(self, path: Path, input_file_id: str | None, tag: BatchTag) -> ProviderBatch: ...

    async def find(
        self, tag: BatchTag, created_after: float, total: int, is_ours: Callable[[str], bool]
    ) -> ProviderBatch | None: ...

    async def retrieve(self, batch_id: str) -> ProviderBatch: ...

    def results(self, batch: ProviderBatch) -> AsyncIterator[BatchLine]: ...

    async def cancel(self, batch_id: str) -> ProviderBatch: ...

    async def clean_up(self, batch: ProviderBatch) -> None:
        """After an ended batch's results are mapped: what the provider keeps for it that the
        ledger no longer needs (Azure: its files, a resource holds at most 500)."""

    async def aclose(self) -> None: ...
