"""Turning what stages hand us into provider-neutral `llm_requests` rows.

A request is stored as its caller wrote it, whichever shape it arrived in (an OpenAI
Batch input line, a bare chat body, an Anthropic batch line, a Gemini batch line, a
Python call): system, messages, params, response format, each message and part in its
own provider's words (tool calls, tool results, content parts, cache marks: nothing is
left out). The adapter of the provider that answers translates at call time, so a file
prepared for one provider can be replayed on another; what that provider cannot express
is refused here, and parameters it does not take are named (`dropped_params`).

The idempotency key is the caller's `custom_id` or, when absent, a hash of the
request's content: enqueuing the same file twice adds nothing. The same key with a
different body is a conflict (ledger/fingerprint.py), never a silent skip.

Everything a request can get wrong is found here, before anything is written, and
named in one line: a file's bytes (not UTF-8, a line over LEDGER_MAX_LINE_BYTES), a
line's JSON (not an object, too deeply nested), the request (unknown provider, no
user message, absurd params: ledger/params.py), and values the databases cannot
store (NaN, NUL characters, unpaired surrogates, strings over a column's length).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import re
import sys
from collections.abc import Generator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from adapters.base import CallRequest
from adapters.input_lines import custom_id_of, read_line
from adapters.openai_responses import RESPONSES_API
from adapters.registry import APIS, PROVIDER_NAMES, RESPONSES_PROVIDERS, api_for, wire_check
from adapters.translation import Untranslatable
from ledger.deadlines import parse_deadline, stored_delivery
from ledger.fingerprint import body_hash, cache_key, canonical, json_texts
from ledger.params import params_problem
from ledger.parsing import PARSERS, parse_name
from ledger.pools import endpoint_for, normalize_endpoint
from ledger.prices import PriceTable, input_bytes, token_estimate
from ledger.settings import DEFAULT_MAX_LINE_BYTES
from ledger.statuses import DeliveryChoice

_ROLES = {"system", "developer", "user", "assistant", "tool"}
# Column lengths (ledger/models.py): PostgreSQL refuses a longer value half-way through an insert.
KEY_MAX_CHARS = 200
_INT32 = 2**31 - 1
# A NUL character as JSON writes it: `\u0000` after an even number of backslashes (an odd
# number is a literal backslash followed by the text "u0000").
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class EnqueueError(ValueError):
    """A request cannot be enqueued; the message names what is wrong (and where)."""


class RequestSpec(BaseModel):
    """What a stage asks for. Everything but `model` and `messages` has a default.

    A bad field raises `EnqueueError` (a ValueError) with a one-line message, not
    pydantic's multi-line report.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    # Text, or Anthropic's system blocks as given (a list: `cache_control` marks kept).
    system: str | list[dict[str, Any]] | None = None
    provider: str = "openai"
    params: dict[str, Any] = Field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    delivery: DeliveryChoice = DeliveryChoice.ONLINE
    # Delivery `auto` only: by when it should be answered (a duration from now such as `6h`, or
    # an ISO-8601 time; 24 hours when not given). ledger/deadlines.py.
    deadline: datetime | None = None
    priority: int = Field(default=0, ge=-_INT32, le=_INT32)
    job_id: str | None = Field(default=None, min_length=1, max_length=200)
    purpose: str | None = Field(default=None, max_length=100)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=KEY_MAX_CHARS)
    endpoint: str | None = Field(default=None, max_length=300)
    trace: dict[str, Any] | None = None
    # Which API answers it: chat, responses (OpenAI's Responses API) or messages (Anthropic's).
    # None: the provider's own (messages for anthropic, chat for the others); chat and messages
    # are the same request in two wire formats, so a file made for one provider replays on another.
    api: str | None = None
    # How the answer is parsed when it comes, in the transaction that records it: `verdict`
    # (reasoning, then a final `VERDICT: <score>` line; `score_range` other than 1-5) or `json`
    # (its JSON value, checked against the response format's schema). None: not parsed here.
    parse: str | None = None
    score_range: tuple[int, int] | None = None
    # The requests this one was built from (lineage): ids of requests already in the ledger.
    sources: list[int] | None = None
    # The response cache: False, never answered from the cache nor made to wait for a twin
    # (it is still a source for others); `sample` asks for another answer to the same question.
    cache: bool = True
    sample: int = Field(default=0, ge=0, le=_INT32)

    def __init__(self, /, **fields: Any) -> None:  # positional-only: a field named "self" is a field
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            raise EnqueueError(_one_line(exc)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise EnqueueError(_one_line(exc)) from None

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        if value not in PROVIDER_NAMES:
            raise ValueError(f"unknown provider {value!r} (known: {', '.join(sorted(PROVIDER_NAMES))})")
        return value

    @field_validator("messages")
    @classmethod
    def _valid_messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(value):
            if not isinstance(message, dict):
                raise ValueError(f"messages[{i}] is not an object")
            if _typed_item(message):  # a Responses API input item (a function call's output, ...)
                continue
            role = message.get("role")
            if role not in _ROLES:
                raise ValueError(f"messages[{i}].role {role!r} is not one of {sorted(_ROLES)}")
            content = message.get("content")
            if content is None and role == "assistant" and message.get("tool_calls"):
                continue  # how OpenAI itself writes a turn that is only tool calls
            if not isinstance(content, str | list):
                raise ValueError(f"messages[{i}].content must be a string or a list of content parts")
            if role == "tool" and not message.get("tool_call_id"):
                raise ValueError(f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers")
        if all(message.get("role") in ("system", "developer") for message in value):
            raise ValueError("messages: needs at least one user message besides the system prompt")
        return value

    @field_validator("params")
    @classmethod
    def _sane_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = params_problem(value)
        if problem is not None:
            raise ValueError(f"params.{problem[0]}: {problem[1]}")
        return value

    @field_validator("api", "parse")
    @classmethod
    def _known_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        known = {"api": ("api", APIS), "parse": ("parser", PARSERS)}[str(info.field_name)]
        if value is not None and value not in known[1]:
            raise ValueError(f"unknown {known[0]} {value!r} (known: {', '.join(known[1])})")
        return value

    @field_validator("sources")
    @classmethod
    def _valid_sources(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        for i, source in enumerate(value):
            if isinstance(source, bool) or not isinstance(source, int) or not 1 <= source < 2**63:
                raise ValueError(f"sources[{i}]: must be a request id (a positive integer), got {source!r}")
        return list(dict.fromkeys(value)) or None

    @model_validator(mode="after")
    def _score_range_fits(self) -> RequestSpec:
        if self.score_range is None:
            return self
        if self.parse != "verdict":
            raise ValueError("score_range: only with parse 'verdict'")
        low, high = self.score_range
        if low >= high:
            raise ValueError(f"score_range: the lowest score must be below the highest, got {low}..{high}")
        return self

    @model_validator(mode="after")
    def _api_fits(self) -> RequestSpec:
        api = api_for(self.provider, self.api)
        if api == RESPONSES_API:
            if self.provider not in RESPONSES_PROVIDERS:
                raise ValueError(
                    f"api: provider {self.provider!r} has no Responses API "
                    f"(it has: {', '.join(sorted(RESPONSES_PROVIDERS))})"
                )
            for name in ("stream", "background"):
                if self.params.get(name):
                    raise ValueError(
                        f"params.{name}: true is not supported (the ledger makes one call and waits for its answer)"
                    )
        else:
            typed = next((i for i, m in enumerate(self.messages) if _typed_item(m)), None)
            if typed is not None:
                raise ValueError(f"messages[{typed}].role is missing (typed input items need api 'responses')")
        return self

    @field_validator("deadline", mode="before")
    @classmethod
    def _readable_deadline(cls, value: Any) -> datetime | None:
        return None if value is None else parse_deadline(value)

    @model_validator(mode="after")
    def _deadline_is_auto(self) -> RequestSpec:
        if self.deadline is not None and self.delivery != DeliveryChoice.AUTO:
            raise ValueError(f"deadline: only with delivery 'auto', not {self.delivery.value!r}")
        return self

    @field_validator("endpoint")
    @classmethod
    def _valid_endpoint(cls, value: str | None) -> str | None:
        return normalize_endpoint(value) if value is not None else None


@dataclass(frozen=True)
class Defaults:
    """Command-line flags: when given they override what a line says."""

    provider: str | None = None
    model: str | None = None
    delivery: DeliveryChoice | None = None
    deadline: datetime | None = None  # --deadline (read once, so every line has the same time)
    job_id: str | None = None
    priority: int | None = None
    parse: str | None = None
    cache: bool | None = None  # False: --no-cache


def _typed_item(message: Any) -> bool:
    """A Responses API input item that is not a message: `{"type": "function_call_output", ...}`."""
    return isinstance(message, dict) and "role" not in message and message.get("type") not in (None, "message")


def _plain_system(message: dict[str, Any]) -> bool:
    """A chat request's leading `{"role": "system", "content": "..."}`: stored as the system text
    (as every request was before its messages were kept whole, so its keys stay what they were)."""
    return message.get("role") == "system" and type(message.get("content")) is str and len(message) == 2


def to_row(
    spec: RequestSpec,
    compatible_base_url: str | None = None,
    prices: PriceTable | None = None,
    *,
    pools_per_model: bool = False,
) -> dict[str, Any]:
    """The `llm_requests` column values for a spec (status and timestamps come from the store).

    With a price table, the request's worst-case cost is fixed here (`estimate_usd`):
    budgets reserve it when the request is claimed. `pools_per_model`: an OpenAI-compatible
    server's requests pool per model (`ledger.pools.endpoint_for`).
    """
    return checked_row(spec, compatible_base_url, prices, pools_per_model=pools_per_model)[0]


def checked_row(
    spec: RequestSpec,
    compatible_base_url: str | None = None,
    prices: PriceTable | None = None,
    max_bytes: int = DEFAULT_MAX_LINE_BYTES,
    *,
    pools_per_model: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """`to_row`, and its JSON columns as the text an enqueue sends (`fingerprint.json_texts`).

    `EnqueueError` for a value the databases cannot store the same way (checked for both,
    so SQLite never keeps a request PostgreSQL would refuse: NaN, a NUL character, an
    unpaired surrogate, an object JSON has no form for) or a request over `max_bytes`.
    """
    api = api_for(spec.provider, spec.api)
    system, messages = spec.system or None, list(spec.messages)
    if api != RESPONSES_API and system is None and _plain_system(messages[0]):
        system, messages = messages[0]["content"], messages[1:]
    input_ = {"system": system, "messages": messages}
    dropped = provider_check(spec, input_, api)
    endpoint = spec.endpoint or endpoint_for(spec.provider, spec.model, compatible_base_url, per_model=pools_per_model)
    delivery, deadline = stored_delivery(spec.delivery, spec.provider, spec.deadline)
    row: dict[str, Any] = {
        "job_id": spec.job_id,
        "purpose": spec.purpose,
        "provider": spec.provider,
        "model": spec.model,
        "endpoint": endpoint,
        "input": input_,
        "params": spec.params or None,
        "response_format": spec.response_format,
        "delivery": delivery,
        "priority": spec.priority,
        "trace": spec.trace,
        "api": api,
        "parse": parse_name(spec.parse, spec.score_range) if spec.parse else None,
        "sources": spec.sources,
        "sample": spec.sample,
        "use_cache": spec.cache,
        "dropped_params": dropped,
    }
    try:
        texts = json_texts(row)
        size = sum(len(text.encode("utf-8")) for text in texts.values())
        row["idempotency_key"] = spec.idempotency_key or content_key(row)
        row["batch_key"] = _batch_key_of(texts["params"], texts["response_format"], row)
        row["body_hash"] = body_hash(row, texts)
        row["cache_key"] = cache_key(row, texts)
        prompt_bytes = input_bytes(input_, texts["input"])
        row["token_estimate"] = token_estimate(prompt_bytes, spec.params)
        if prices is not None:
            batch = spec.delivery == DeliveryChoice.BATCH  # `auto` may end online: reserved at that price
            row["estimate_usd"] = prices.worst_case(spec.provider, spec.model, prompt_bytes, spec.params, batch=batch)
    except (TypeError, ValueError):  # a value JSON or UTF-8 cannot hold (NaN, a datetime, a lone surrogate)
        raise EnqueueError(_unstorable(row)) from None
    if any("\\u0000" in text and _NUL.search(text) for text in texts.values()):  # substring first: fast
        raise EnqueueError(_unstorable(row))
    try:
        for value in row.values():  # the plain text columns: NUL and lone surrogates there too
            if isinstance(value, str):
                value.encode("utf-8")  # a lone surrogate raises
                if "\x00" in value:
                    raise EnqueueError(_unstorable(row))
    except UnicodeEncodeError:
        raise EnqueueError(_unstorable(row)) from None
    if size > max_bytes:
        raise EnqueueError(f"request is {size} bytes as stored, over the limit of {max_bytes} (LEDGER_MAX_LINE_BYTES)")
    row["deadline"] = deadline  # not part of what the request asks: no key or hash covers it
    return row, texts


def provider_check(spec: RequestSpec, input_: dict[str, Any], api: str) -> list[str] | None:
    """The target provider's own check of the request (its adapter module, no SDK): the names of
    the parameters it leaves out (sorted, once each; None for none), or `EnqueueError` naming
    what its API cannot express."""
    check = wire_check(spec.provider, api)
    if check is None:
        return None
    call = CallRequest(spec.model, input_["messages"], input_["system"], spec.params, spec.response_format, api)
    try:
        dropped = check(call)
    except Untranslatable as exc:
        raise EnqueueError(str(exc)) from None
    return sorted(set(dropped)) or None


def count_dropped(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], int]:
    """(provider, parameter) -> how many of `rows` it was left out of."""
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        for name in row.get("dropped_params") or ():
            counts[(row["provider"], name)] = counts.get((row["provider"], name), 0) + 1
    return counts


def dropped_warnings(counts: Mapping[tuple[str, str], int]) -> list[str]:
    """One line per (provider, parameter) left out: `anthropic takes no temperature: left out of
    3 request(s)` (the enqueue prints them as warnings, the Python API and jobs log them)."""
    return [f"{provider} takes no {name}: left out of {n} request(s)" for (provider, name), n in sorted(counts.items())]


def warn_dropped(counts: Mapping[tuple[str, str], int]) -> None:
    """A logged warning per parameter left out of requests (the Python API's and jobs' enqueues)."""
    for line in dropped_warnings(counts):
        logging.getLogger("ledger.enqueue").warning(line)


def _unstorable(row: dict[str, Any]) -> str:
    """Which field holds a value JSON or the databases cannot store, and what it is."""
    for field, value in row.items():
        try:
            text = canonical(value)
        except TypeError as exc:
            return f"{field}: not JSON ({exc})"
        except ValueError:
            return f"{field}: holds NaN or an infinite number (not JSON)"
        if _NUL.search(text):
            return f"{field}: holds a NUL character (\\u0000), which PostgreSQL cannot store"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{field}: holds an unpaired surrogate ({exc.object[exc.start]!a}), not UTF-8"
    return "not storable as JSON"


def batch_key(row: dict[str, Any]) -> str:
    """Requests sharing params and response format may share a provider batch; a
    batch goes to one endpoint, so requests of different APIs never share one."""
    keyed = {"params": row["params"], "response_format": row["response_format"]}
    if row.get("api") == RESPONSES_API:
        keyed["api"] = RESPONSES_API
    return _digest(keyed)[:16]


# batch_key by (params, response format, api) as canonical text: a file's requests mostly share
# their parameters, and the key's own JSON (sorted, ASCII) is made once per set of them.
_BATCH_KEYS: dict[tuple[str, str, bool], str] = {}
_BATCH_KEYS_AT_MOST = 4096


def _batch_key_of(params_text: str, response_format_text: str, row: dict[str, Any]) -> str:
    """`batch_key(row)`, remembered by the canonical texts it depends on."""
    memo = (params_text, response_format_text, row.get("api") == RESPONSES_API)
    found = _BATCH_KEYS.get(memo)
    if found is None:
        if len(_BATCH_KEYS) >= _BATCH_KEYS_AT_MOST:
            _BATCH_KEYS.clear()
        found = _BATCH_KEYS[memo] = batch_key(row)
    return found


def content_key(row: dict[str, Any]) -> str:
    """A stable key for a request without `custom_id`: the hash of everything it asks for."""
    keyed = {
        k: row[k] for k in ("job_id", "purpose", "provider", "model", "input", "params", "response_format", "trace")
    }
    for extra in ("api", "parse", "sources"):  # only when set: older requests' keys stay what they were
        if row.get(extra) is not None and (extra != "api" or row[extra] == RESPONSES_API):
            keyed[extra] = row[extra]
    if row.get("sample"):  # likewise: a sample other than the first
        keyed["sample"] = row["sample"]
    return "sha256:" + _digest(keyed)[:40]


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def spec_from_line(obj: Any, defaults: Defaults) -> RequestSpec:
    """Read one JSONL object in any of the accepted shapes (`adapters.input_lines` knows them)."""
    if not isinstance(obj, dict):
        raise EnqueueError("line is not a JSON object")
    custom_id = custom_id_of(obj)
    if custom_id is not None and not isinstance(custom_id, str | int):
        raise EnqueueError(f"custom_id must be a string, got {type(custom_id).__name__}")
    if custom_id is not None and not 1 <= len(str(custom_id)) <= KEY_MAX_CHARS:
        raise EnqueueError(f"custom_id must be 1 to {KEY_MAX_CHARS} characters, got {len(str(custom_id))}")
    ledger_fields = _ledger_fields(obj, defaults)
    try:
        line = read_line(obj, LEDGER_LINE_KEYS)
    except ValueError as exc:
        raise EnqueueError(str(exc)) from None
    fields: dict[str, Any] = {
        **line.fields,
        "model": defaults.model or line.fields.get("model") or "",
        "provider": defaults.provider or line.provider or "openai",
        "idempotency_key": str(custom_id) if custom_id is not None else None,
        "job_id": defaults.job_id,
        **ledger_fields,
    }
    return _line_spec(fields, defaults)


# A line's top-level keys that are the ledger's, not the provider's (in every shape).
LEDGER_LINE_KEYS = frozenset({"parse", "score_range", "sources", "cache", "sample", "deadline"})


def _ledger_fields(obj: dict[str, Any], defaults: Defaults) -> dict[str, Any]:
    """The ledger's own keys of a line (`parse`, `score_range`, `sources`, `cache`, `sample`), with
    `--parse` and `--no-cache` over them."""
    found = {k: obj[k] for k in LEDGER_LINE_KEYS if k in obj}
    if defaults.parse is not None:
        found["parse"] = defaults.parse
    if defaults.cache is False:
        found["cache"] = False
    return found


def _line_spec(fields: dict[str, Any], defaults: Defaults) -> RequestSpec:
    """A line's spec, with the command line's --delivery and --priority over it."""
    if defaults.delivery is not None:
        fields["delivery"] = defaults.delivery
    elif fields.get("deadline") is not None:  # a line's deadline asks for `auto`
        fields["delivery"] = DeliveryChoice.AUTO
    if defaults.deadline is not None:
        fields["deadline"] = defaults.deadline
    if defaults.priority is not None:
        fields["priority"] = defaults.priority
    if not fields["model"]:
        raise EnqueueError("missing 'model' (give it in the line or with --model)")
    return build_spec(**fields)


def build_spec(**fields: Any) -> RequestSpec:
    """A validated spec, or an `EnqueueError` whose message is one line."""
    return RequestSpec(**fields)


def as_spec(item: object) -> RequestSpec:
    """A stage's request as a spec: a `RequestSpec`, or a mapping of its fields.

    Anything else is named in one `EnqueueError` line: a Python caller handing over a
    list of dicts or strings gets the same kind of message as a bad JSONL line, not an
    `AttributeError` from deep inside the enqueue.
    """
    if isinstance(item, RequestSpec):
        return item
    if isinstance(item, Mapping):
        if not all(isinstance(name, str) for name in item):
            raise EnqueueError("not a request: a mapping's keys must be field names (strings)")
        return RequestSpec(**item)
    raise EnqueueError(f"not a request: expected a RequestSpec or a mapping of its fields, got {type(item).__name__}")


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    message = str(err.get("ctx", {}).get("error") or err["msg"])
    if not where or message.startswith(where):
        return message
    return f"{where}: {message}"


def read_jsonl(lines: Iterable[str], defaults: Defaults) -> Iterator[tuple[int, RequestSpec]]:
    """Yield (line number, spec) lazily; raise `EnqueueError` naming the first bad line."""
    for number, line in enumerate(lines, start=1):
        try:
            spec = _spec_of(line, defaults)
        except EnqueueError as exc:
            raise EnqueueError(f"line {number}: {exc}") from None
        if spec is not None:
            yield number, spec


# `ledger enqueue -`: the lines come from standard input, named `<stdin>` in messages.
STDIN = Path("-")


def _opened(path: Path) -> AbstractContextManager[BinaryIO]:
    return nullcontext(sys.stdin.buffer) if path == STDIN else path.open("rb")


def read_jsonl_file(
    path: Path, defaults: Defaults, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[tuple[int, RequestSpec]]:
    """Yield (line number, spec) from a file, streaming; raise `EnqueueError` as `FILE:LINE: problem`."""
    source = "<stdin>" if path == STDIN else str(path)
    for number, raw in raw_lines(path, max_line_bytes):
        try:
            spec = spec_of_raw(number, raw, defaults, max_line_bytes)
        except EnqueueError as exc:
            raise EnqueueError(f"{source}:{number}: {exc}") from None
        if spec is not None:
            yield number, spec


def raw_lines(path: Path, max_line_bytes: int) -> Generator[tuple[int, bytes], None, None]:
    """Yield (line number, bytes) of a file, streaming, one line at a time and never more than
    `max_line_bytes` of it (a file with no newline at all cannot fill memory: a longer line is
    cut there, and `spec_of_raw` names it)."""
    with _opened(path) as f:
        number = 0
        while raw := f.readline(max_line_bytes + 2):  # room for the line's own CR LF
            number += 1
            yield number, raw


def spec_of_raw(number: int, raw: bytes, defaults: Defaults, max_line_bytes: int) -> RequestSpec | None:
    """One line's spec from its bytes (None for a blank line), or `EnqueueError` saying what is wrong.

    A UTF-8 byte-order mark at the start of the file is dropped; any other byte sequence that
    is not UTF-8 is named, with its column."""
    if number == 1:
        raw = _without_bom(raw)
    body = raw.rstrip(b"\r\n")
    if len(body) > max_line_bytes:
        raise EnqueueError(f"line is longer than {max_line_bytes} bytes (LEDGER_MAX_LINE_BYTES)")
    try:
        line = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnqueueError(f"not UTF-8 (byte 0x{body[exc.start]:02x} at column {exc.start + 1})") from None
    return _spec_of(line, defaults)


def _without_bom(raw: bytes) -> bytes:
    if raw.startswith(codecs.BOM_UTF8):
        return raw[len(codecs.BOM_UTF8) :]
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise EnqueueError("not UTF-8 (the file starts with a UTF-16 byte-order mark; save it as UTF-8)")
    return raw


def _spec_of(line: str, defaults: Defaults) -> RequestSpec | None:
    """One line's spec (None for a blank line)."""
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise EnqueueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise EnqueueError("invalid JSON (nested too deeply)") from None
    return spec_from_line(obj, defaults)
