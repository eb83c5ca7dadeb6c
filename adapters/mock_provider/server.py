"""A mock LLM provider over real HTTP: OpenAI (chat and Responses, also at Azure's paths), Anthropic and
Gemini wire formats, no keys (Gemini's routes: `gemini_batches.py`, its bodies: `gemini_wire.py`).

The real `openai`, `anthropic` and `google-genai` SDKs talk to it unchanged, so tests, the demo
and the benchmarks exercise the whole path. It simulates latency, a concurrency
cap, and requests- and tokens-per-minute limits (each answered with 429 +
retry-after; with `--rpm` or `--tpm`, every answer carries the provider's
rate-limit headers: what is left and when the window has room again), random faults, and deterministic per-prompt
faults via `[[mock:...]]` directives in the prompt text:

    [[mock:fail=503x2]]   the first 2 calls of this prompt get 503 (`x*`: every call)
    [[mock:fail=429]]     429 with retry-after `[[mock:retry_after=S]]` (default 1 s; Gemini: RetryInfo)
    [[mock:quota]]        the account's quota is spent: OpenAI 429 insufficient_quota, Anthropic 400
                          credit balance too low, Gemini 429 with a per-day QuotaFailure
                          (`POST /_quota {"model": M, "spent": true}`: every
                          call of model M, until `"spent": false`)
    [[mock:refuse]]       the model refuses (OpenAI `refusal`, Anthropic `stop_reason: refusal`)
    [[mock:hang]]         the first call hangs for `hang_seconds` (past any timeout)
    [[mock:malformed]]    a 200 with a truncated body; `[[mock:error200]]`: a 200 with an error object
    [[mock:latency=S]]    this prompt's own latency
    [[mock:hold]]         answered only once `POST /_release` was called: a test's latch,
                          to act while calls are certainly in flight
    [[mock:omit=N]]       structured answers (a JSON schema whose array items have an enum
                          property, e.g. `criterion_id`): the last N items are left out
    [[mock:corrupt=N]]    structured answers: the first N items are invalid (score "excellent");
                          neither touches plain prompts (see `answers.py`)

`GET /_stats` tells what the provider saw; `POST /_reset` zeroes it; `GET /_answered/{id}` gives
an answer body it sent (online or in a batch's results) as the JSON text it sent.

Built on h11 + anyio rather than `http.server`: each response goes out in one
write with TCP_NODELAY (no Nagle/delayed-ACK stalls of ~40 ms), the listen
backlog is large, and a client that gives up (timeout, killed process) is noticed
at once, so `in_flight` is what the provider would really be serving.
"""

from __future__ import annotations

import json
import random
import re
import socket
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import anyio
import h11
from anyio.abc import SocketAttribute, SocketStream, TaskStatus

from adapters.mock_provider import checks, gemini_wire
from adapters.mock_provider.answers import (
    chat_answer,
    directives,
    max_output,
    model_answer,
    prompt_key,
    prompt_text,
    request_prompt,
)
from adapters.mock_provider.batches import BatchStore
from adapters.mock_provider.config import MockProviderConfig
from adapters.mock_provider.gemini_batches import GeminiBatchRoutes
from adapters.mock_provider.wire import (
    Answered,
    Reply,
    answer_body,
    azure_model,
    error_reply,
    error_type,
    json_reply,
    rate_limited,
)

_GEMINI_PATH = re.compile(r"^/(?:upload/|download/)?v1[a-z0-9]*/(.+)$")


class ClientGone(Exception):
    """The client closed the connection while we were 'thinking'."""


class MockProviderServer:
    def __init__(self, config: MockProviderConfig | None = None) -> None:
        self.config = config or MockProviderConfig()
        self._rng = random.Random(self.config.seed)
        self._released: anyio.Event | None = None
        self.prompt_cache: set[str] = set()
        self.quota_spent: set[str] = set()  # models whose account's quota is spent (`POST /_quota`)
        self.answered = Answered()
        self.batches = BatchStore(self.config, self._rng, self.prompt_cache, self.answered)
        self.gemini_batches = GeminiBatchRoutes(self.batches)
        checks.warm_soon()
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.refused = 0  # model calls refused as the provider would (`checks.py`)
        self.status_counts: Counter[str] = Counter()
        self.per_prompt: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._recent: deque[float] = deque()
        self._spent: deque[tuple[float, int]] = deque()  # (admitted at, tokens) within the window
        self._first_call: float | None = None
        self._last_answer: float | None = None
        self.prompt_cache.clear()  # prompt prefixes seen: cached tokens next time (shared with batches)
        self.batches.reset()

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "refused": self.refused,
            "status_counts": dict(self.status_counts),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "per_prompt": dict(self.per_prompt),
            # From the first model call received to the last answer sent: the provider's busy span.
            "busy_seconds": (self._last_answer - self._first_call) if self._first_call and self._last_answer else 0.0,
            **self.batches.stats(),
        }

    # -- serving ---------------------------------------------------------------

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(
            local_host=self.config.host, local_port=self.config.port, backlog=self.config.backlog
        )
        port = listener.extra(SocketAttribute.local_port)
        self.port = port
        task_status.started(port)
        async with listener:
            await listener.serve(self._connection)

    async def _connection(self, stream: SocketStream) -> None:
        raw = stream.extra(SocketAttribute.raw_socket)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h11.Connection(h11.SERVER)
        async with stream:
            try:
                while True:
                    request, body = await self._read_request(conn, stream)
                    if request is None:
                        return
                    try:
                        reply = await self._dispatch(request, body, stream, conn)
                        if reply.delay > 0:
                            await self._think(reply.delay, stream, conn)
                    except ClientGone:
                        return
                    if not await self._write(conn, stream, reply):
                        return
                    if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
            except (
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                anyio.EndOfStream,
                h11.RemoteProtocolError,
                ConnectionError,
            ):
                return

    async def _read_request(self, conn: h11.Connection, stream: SocketStream) -> tuple[h11.Request | None, bytes]:
        request: h11.Request | None = None
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await stream.receive(65536)
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                    data = b""
                conn.receive_data(data)
                if not data and request is None:
                    return None, b""
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return request, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None, b""

    async def _write(self, conn: h11.Connection, stream: SocketStream, reply: Reply) -> bool:
        headers = [("content-type", reply.content_type), ("content-length", str(len(reply.body))), *reply.headers]
        head = conn.send(h11.Response(status_code=reply.status, headers=headers, reason=b"")) or b""
        cut, pause = reply.stall or (0, 0.0)
        try:
            if pause > 0:  # a download stalled half-way: the first part, a pause, then the rest
                await stream.send(head + (conn.send(h11.Data(data=reply.body[:cut])) or b""))
                head = b""
                await anyio.sleep(pause)
            tail = reply.body[cut:] if pause > 0 else reply.body
            # One write: headers and body together.
            await stream.send(head + (conn.send(h11.Data(data=tail)) or b"") + (conn.send(h11.EndOfMessage()) or b""))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            return False
        return True

    async def _think(self, seconds: float, stream: SocketStream, conn: h11.Connection) -> None:
        """Sleep like a model, but stop at once if the client hangs up."""
        if seconds > 0:
            await self._until(lambda: anyio.sleep(seconds), stream, conn)

    def _latch(self) -> anyio.Event:
        """Opened by `POST /_release`; `[[mock:hold]]` calls wait for it (made on first use: an
        anyio event needs the running loop)."""
        if self._released is None:
            self._released = anyio.Event()
        return self._released

    async def _until(self, wait: Callable[[], Awaitable[object]], stream: SocketStream, conn: h11.Connection) -> None:
        """Wait for `wait()`, but stop at once if the client hangs up."""
        gone = False
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                nonlocal gone
                try:
                    data = await stream.receive(65536)
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                    data = b""
                if data:
                    conn.receive_data(data)  # pipelined bytes: keep them for the next cycle
                    return
                gone = True
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await wait()
            tg.cancel_scope.cancel()
        if gone:
            raise ClientGone

    # -- routing ---------------------------------------------------------------

    async def _dispatch(self, request: h11.Request, body: bytes, stream: SocketStream, conn: h11.Connection) -> Reply:
        method = request.method.decode()
        target = request.target.decode()
        path = target.split("?", 1)[0]
        host = dict(request.headers).get(b"host", b"").decode() or f"{self.config.host}:{self.port}"
        if method == "GET" and path == "/_stats":
            return json_reply(200, self.stats())
        if method == "GET" and path.startswith("/_answered/"):
            sent = self.answered.text(path.removeprefix("/_answered/"))
            return Reply(200, sent.encode()) if sent is not None else json_reply(404, {"error": "not answered"})
        if method == "POST" and path == "/_reset":
            self.reset()
            return json_reply(200, {"ok": True})
        if method == "POST" and path == "/_release":
            self._latch().set()
            return json_reply(200, {"ok": True})
        if method == "POST" and path == "/_quota":  # {"model": M, "spent": bool}: M's quota spent, or reset
            asked = json.loads(body)
            model = str(asked["model"])
            if asked.get("spent"):
                self.quota_spent.add(model)
            else:
                self.quota_spent.discard(model)
            return json_reply(200, {"ok": True})
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            return await self._model_call("openai", body, stream, conn)
        if method == "POST" and path == "/v1/messages":
            return await self._model_call("anthropic", body, stream, conn)
        if method == "POST" and path in ("/v1/responses", "/responses", "/openai/responses"):
            return await self._model_call("responses", body, stream, conn)
        headers = dict(request.headers)
        # Gemini: `google-genai` sends its key so; a resumable upload's URL is its own credential.
        if b"x-goog-api-key" in headers or path.startswith(("/upload/", "/download/")):
            return await self._gemini(method, target, body, headers, host, stream, conn)
        if method == "POST" and path.startswith("/openai/deployments/") and path.endswith("/chat/completions"):
            # Azure OpenAI: the deployment in the path (the SDK keeps it in the body's `model` too).
            return await self._model_call("azure", body, stream, conn)
        reply = self.batches.route(method, target, body, headers, host)
        if reply is not None:
            return reply
        return error_reply("openai", 404, "invalid_request_error", f"Invalid URL ({method} {path})")

    async def _gemini(
        self,
        method: str,
        target: str,
        body: bytes,
        headers: dict[bytes, bytes],
        host: str,
        stream: SocketStream,
        conn: h11.Connection,
    ) -> Reply:
        """Gemini's paths, under any API version (`/v1/`, `/v1beta/`; uploads under `/upload/`)."""
        path, _, query = target.partition("?")
        found = _GEMINI_PATH.match(path)
        rest = found.group(1) if found else ""
        if method == "POST" and rest.startswith("models/") and rest.endswith(":generateContent"):
            model = rest.removeprefix("models/").removesuffix(":generateContent")
            return await self._model_call("gemini", body, stream, conn, model)
        args = {k: v[0] for k, v in parse_qs(query).items()}
        reply = self.gemini_batches.route(method, rest, args, body, headers, host)
        if reply is not None:
            return reply
        return error_reply("gemini", 404, "not_found", f"no route {method} {path}")

    async def _model_call(
        self, wire: str, body: bytes, stream: SocketStream, conn: h11.Connection, model: str | None = None
    ) -> Reply:
        """One model call in `wire`'s format (`model`: the model a Gemini path names); a Gemini body
        is read as the chat-shaped payload the answers are made from, and answered in Gemini's."""
        try:
            payload = json.loads(body)
        except ValueError:
            return self._count(json_reply(400, checks.error_body(wire, checks.unparsable(wire))))
        refusal = checks.check(wire, payload)
        if refusal is not None:  # what the provider itself would refuse
            self.refused += 1
            return self._count(json_reply(400, checks.error_body(wire, refusal)))
        try:
            if wire == "gemini":
                payload = gemini_wire.as_chat(payload, model or "gemini")
            system, messages = request_prompt(wire, payload)
            if not isinstance(messages, list):
                raise TypeError("messages")
        except (ValueError, KeyError, TypeError, AttributeError):
            what = "input" if wire == "responses" else "messages"
            return self._count(error_reply(wire, 400, "invalid_request_error", f"body must be JSON with {what}"))
        key = prompt_key(system, messages)
        self.calls += 1
        self.per_prompt[key] += 1
        if self._first_call is None:
            self._first_call = time.monotonic()
        if self.config.max_concurrency is not None and self.in_flight >= self.config.max_concurrency:
            reply = rate_limited(wire, self.config.concurrency_retry_after, "too many requests in flight")
            return self._count(self._with_rate_headers(wire, reply))
        rated = self.config.rpm_model in (None, payload.get("model"))
        limited = self._over_rpm() if rated else None
        if limited is not None and self.config.proxy_headers:
            wait = [("llm_provider-retry-after", f"{self.config.rpm_window:g}")]
            return self._count(error_reply(wire, 429, "rate_limit_error", "requests per minute exceeded", wait))
        if limited is not None:
            reply = rate_limited(wire, limited, "requests per minute exceeded")
            return self._count(self._with_rate_headers(wire, reply))
        limited = self._over_tpm(wire, payload)
        if limited is not None:
            reply = rate_limited(wire, limited, "tokens per minute exceeded")
            return self._count(self._with_rate_headers(wire, reply))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            reply = await self._answer(wire, payload, system, messages, key, stream, conn)
        finally:
            self.in_flight -= 1
        return self._count(self._with_rate_headers(wire, reply) if rated else reply)

    def _count(self, reply: Reply) -> Reply:
        self.status_counts[str(reply.status)] += 1
        self._last_answer = time.monotonic()
        return reply

    def _over_rpm(self) -> float | None:
        """Seconds until the window has room (a 429), or None: this call is counted and goes on."""
        if self.config.rpm is None:
            return None
        now = self._window_now()
        if len(self._recent) >= self.config.rpm:
            return max(0.05, self.config.rpm_window - (now - self._recent[0]))
        self._recent.append(now)
        return None

    def _over_tpm(self, wire: str, payload: dict[str, Any]) -> float | None:
        """With a `tpm` cap, seconds until the oldest call leaves the window (a 429), or None: the
        call is counted and goes on. A call counts from its admission, as the providers estimate
        it: the prompt plus `max_tokens` (else the answer's own length), whatever it then uses;
        one that does not fit in what is left is refused, unless the window is empty."""
        if self.config.tpm is None:
            return None
        system, messages = request_prompt(wire, payload)
        answer = chat_answer(payload.get("model", "mock"), system, messages, payload.get("response_format"))
        tokens = answer.input_tokens + (max_output(payload) or answer.output_tokens)
        now = self._window_now()
        if self._spent and self._tokens_spent() + tokens > self.config.tpm:
            return max(0.05, self.config.rpm_window - (now - self._spent[0][0]))
        self._spent.append((now, tokens))
        return None

    def _tokens_spent(self) -> int:
        return sum(tokens for _, tokens in self._spent)

    def _window_now(self) -> float:
        now = time.monotonic()
        while self._recent and now - self._recent[0] >= self.config.rpm_window:
            self._recent.popleft()
        while self._spent and now - self._spent[0][0] >= self.config.rpm_window:
            self._spent.popleft()
        return now

    def _with_rate_headers(self, wire: str, reply: Reply) -> Reply:
        """With an `rpm` or `tpm` cap, every answer says what is left of the window as of when it
        is sent, and when the window is whole again (everything counted out of it), the way each
        provider says it (OpenAI: a duration; Anthropic: the moment). A 429's retry-after says
        when the oldest counted call leaves the window."""
        if self.config.rpm is None and self.config.tpm is None:
            return reply
        now = self._window_now()
        window = self.config.rpm_window
        headers: list[tuple[str, str]] = []
        if self.config.rpm is not None:
            remaining = max(self.config.rpm - len(self._recent), 0)
            reset = window - (now - self._recent[-1]) if self._recent else 0.0
            headers += _rate_headers(wire, "requests", self.config.rpm, remaining, reset)
            if self.config.proxy_headers:  # the count without the reset
                headers = [h for h in headers if not h[0].startswith("x-ratelimit-reset")]
        if self.config.tpm is not None:
            remaining = max(self.config.tpm - self._tokens_spent(), 0)
            reset = window - (now - self._spent[-1][0]) if self._spent else 0.0
            headers += _rate_headers(wire, "tokens", self.config.tpm, remaining, reset)
        reply.headers = [*reply.headers, *headers]
        return reply

    async def _answer(
        self,
        wire: str,
        payload: dict[str, Any],
        system: Any,
        messages: list[dict[str, Any]],
        key: str,
        stream: SocketStream,
        conn: h11.Connection,
    ) -> Reply:
        found = directives(prompt_text(system, messages))
        nth = self.per_prompt[key]
        latency = float(found["latency"]) if "latency" in found else self.config.latency
        if self.config.jitter:
            latency += self._rng.uniform(0, self.config.jitter)
        fault = self._fault(found, nth)
        if fault == "hang":
            await self._think(self.config.hang_seconds, stream, conn)
        if "hold" in found:  # a test's latch: answered once `POST /_release` opens it
            await self._until(self._latch().wait, stream, conn)
        await self._think(latency, stream, conn)
        if fault == "malformed":
            return Reply(200, b'{"id": "cmpl-broken", "choices": [')
        if fault == "error200":
            return json_reply(200, {"error": {"message": "upstream provider error", "code": 502}})
        if fault == "quota" or str(payload.get("model")) in self.quota_spent:
            self.status_counts["quota"] += 1
            return quota_spent(wire)
        if fault is not None and fault.isdigit():
            status = int(fault)
            if status == 429:
                return rate_limited(wire, float(found.get("retry_after", 1)), "rate limited (injected)")
            return error_reply(wire, status, error_type(status), f"injected {status}")
        answer = model_answer(wire, payload, self.prompt_cache)
        named = str(payload.get("model", "mock"))
        if wire == "azure":  # Azure names the model behind the deployment in its answer
            named = azure_model(named)
        return json_reply(200, self.answered.note(answer_body(wire, named, answer, payload)))

    def _fault(self, found: dict[str, str], nth: int) -> str | None:
        """Which fault this call gets: directives first (deterministic), then the dice."""
        if "quota" in found:
            return "quota"
        if "fail" in found:
            status, _, times = found["fail"].partition("x")
            if times == "*" or nth <= int(times or 1):
                return status
        for kind in ("hang", "malformed", "error200"):
            if kind in found and nth <= int(found[kind] or 1):
                return kind
        for kind, rate in self.config.fault_rates.items():
            if self._rng.random() < rate:
                return kind
        return None


def quota_spent(wire: str) -> Reply:
    """What each provider answers once the account can pay for no more: OpenAI a 429
    `insufficient_quota`, Anthropic a 400 saying the credit balance is too low, Gemini a 429
    whose QuotaFailure names a per-day quota."""
    if wire == "gemini":
        return json_reply(429, gemini_wire.per_day_spent())
    if wire == "anthropic":
        message = (
            "Your credit balance is too low to access the Anthropic API. "
            "Please go to Plans & Billing to upgrade or purchase credits."
        )
        return error_reply(wire, 400, "invalid_request_error", message)
    error = {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
    return json_reply(429, {"error": error})


def _rate_headers(wire: str, kind: str, limit: int, remaining: int, reset: float) -> list[tuple[str, str]]:
    """One window's rate-limit headers (`kind`: requests or tokens) in the provider's own names
    (Gemini sends none: its 429s say it in their body)."""
    if wire == "gemini":
        return []
    if wire != "anthropic":
        return [
            (f"x-ratelimit-limit-{kind}", str(limit)),
            (f"x-ratelimit-remaining-{kind}", str(remaining)),
            (f"x-ratelimit-reset-{kind}", f"{reset:.3f}s"),
        ]
    at = datetime.now(UTC) + timedelta(seconds=reset)
    return [
        (f"anthropic-ratelimit-{kind}-limit", str(limit)),
        (f"anthropic-ratelimit-{kind}-remaining", str(remaining)),
        (f"anthropic-ratelimit-{kind}-reset", at.isoformat(timespec="milliseconds").replace("+00:00", "Z")),
    ]
