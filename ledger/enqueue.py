"""Turning what stages hand us into provider-neutral `llm_requests` rows.

A request is stored the same way whichever shape it arrived in (an OpenAI Batch
input line, a bare chat body, an Anthropic batch line, a Python call): system
text, messages, params, response format. Adapters translate at call time, so a
file prepared for one provider can be replayed on another.

The idempotency key is the caller's `custom_id` or, when absent, a hash of the
request's content: enqueuing the same file twice adds nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adapters.registry import PROVIDER_NAMES
from ledger.models import Delivery
from ledger.pools import endpoint_for, normalize_endpoint
from ledger.prices import PriceTable, token_estimate

_ROLES = {"system", "developer", "user", "assistant", "tool"}
# Body keys that are not sampling parameters.
_NOT_PARAMS = {"model", "messages", "system", "response_format", "metadata", "stream", "stream_options"}


class EnqueueError(ValueError):
    """A request cannot be enqueued; the message names what is wrong (and where)."""


class RequestSpec(BaseModel):
    """What a stage asks for. Everything but `model` and `messages` has a default."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | None = None
    provider: str = "openai"
    params: dict[str, Any] = Field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    delivery: Delivery = Delivery.ONLINE
    priority: int = 0
    job_id: str | None = None
    purpose: str | None = None
    idempotency_key: str | None = None
    endpoint: str | None = None
    trace: dict[str, Any] | None = None

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
            if message.get("role") not in _ROLES:
                raise ValueError(f"messages[{i}].role {message.get('role')!r} is not one of {sorted(_ROLES)}")
            if not isinstance(message.get("content"), str | list):
                raise ValueError(f"messages[{i}].content must be a string or a list of content parts")
        if all(message["role"] in ("system", "developer") for message in value):
            raise ValueError("messages: needs at least one user message besides the system prompt")
        return value

    @field_validator("endpoint")
    @classmethod
    def _valid_endpoint(cls, value: str | None) -> str | None:
        return normalize_endpoint(value) if value is not None else None


@dataclass(frozen=True)
class Defaults:
    """Command-line flags: when given they override what a line says."""

    provider: str | None = None
    model: str | None = None
    delivery: Delivery | None = None
    job_id: str | None = None
    priority: int | None = None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def to_row(
    spec: RequestSpec, compatible_base_url: str | None = None, prices: PriceTable | None = None
) -> dict[str, Any]:
    """The `llm_requests` column values for a spec (status and timestamps come from the store).

    With a price table, the request's worst-case cost is fixed here (`estimate_usd`):
    budgets reserve it when the request is claimed.
    """
    system_parts = [spec.system] if spec.system else []
    messages: list[dict[str, Any]] = []
    for message in spec.messages:
        if message["role"] in ("system", "developer"):
            system_parts.append(_text_of(message["content"]))
        else:
            messages.append({"role": message["role"], "content": message["content"]})
    input_ = {"system": "\n\n".join(system_parts) or None, "messages": messages}
    endpoint = spec.endpoint or endpoint_for(spec.provider, spec.model, compatible_base_url)
    row: dict[str, Any] = {
        "job_id": spec.job_id,
        "purpose": spec.purpose,
        "provider": spec.provider,
        "model": spec.model,
        "endpoint": endpoint,
        "input": input_,
        "params": spec.params or None,
        "response_format": spec.response_format,
        "delivery": spec.delivery.value,
        "priority": spec.priority,
        "trace": spec.trace,
    }
    row["idempotency_key"] = spec.idempotency_key or content_key(row)
    row["batch_key"] = batch_key(row)
    prompt_bytes = len(json.dumps(input_, ensure_ascii=False).encode())
    row["token_estimate"] = token_estimate(prompt_bytes, spec.params)
    if prices is not None:
        batch = spec.delivery is Delivery.BATCH
        row["estimate_usd"] = prices.worst_case(spec.provider, spec.model, prompt_bytes, spec.params, batch=batch)
    return row


def batch_key(row: dict[str, Any]) -> str:
    """Requests sharing params and response format may share a provider batch (seed 003)."""
    return _digest({"params": row["params"], "response_format": row["response_format"]})[:16]


def content_key(row: dict[str, Any]) -> str:
    """A stable key for a request without `custom_id`: the hash of everything it asks for."""
    keyed = {
        k: row[k] for k in ("job_id", "purpose", "provider", "model", "input", "params", "response_format", "trace")
    }
    return "sha256:" + _digest(keyed)[:40]


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def spec_from_line(obj: Any, defaults: Defaults) -> RequestSpec:
    """Read one JSONL object in any of the accepted shapes."""
    if not isinstance(obj, dict):
        raise EnqueueError("line is not a JSON object")
    custom_id = obj.get("custom_id")
    provider = None
    if "body" in obj:  # OpenAI Batch input line
        body = obj["body"]
        url = str(obj.get("url", "/v1/chat/completions"))
        if url.rstrip("/").endswith("/messages"):
            provider = "anthropic"
        elif not url.rstrip("/").endswith("/chat/completions"):
            raise EnqueueError(f"url {url!r} is not a chat endpoint (/v1/chat/completions or /v1/messages)")
    elif "params" in obj and custom_id is not None:  # Anthropic Message Batches line
        body, provider = obj["params"], "anthropic"
    else:  # bare chat request body
        body = obj
    if not isinstance(body, dict):
        raise EnqueueError("request body is not a JSON object")
    if "messages" not in body:
        raise EnqueueError("missing 'messages'")
    system = body.get("system")
    fields: dict[str, Any] = {
        "model": defaults.model or body.get("model") or "",
        "messages": body["messages"],
        "system": _text_of(system) if system else None,
        "provider": defaults.provider or provider or "openai",
        "params": {k: v for k, v in body.items() if k not in _NOT_PARAMS},
        "response_format": body.get("response_format"),
        "idempotency_key": str(custom_id) if custom_id is not None else None,
        "trace": body.get("metadata") if isinstance(body.get("metadata"), dict) else None,
        "job_id": defaults.job_id,
    }
    if defaults.delivery is not None:
        fields["delivery"] = defaults.delivery
    if defaults.priority is not None:
        fields["priority"] = defaults.priority
    if not fields["model"]:
        raise EnqueueError("missing 'model' (give it in the line or with --model)")
    return build_spec(**fields)


def build_spec(**fields: Any) -> RequestSpec:
    """A validated spec, or an `EnqueueError` whose message is one line."""
    try:
        return RequestSpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        message = str(err.get("ctx", {}).get("error") or err["msg"])
        if not where or message.startswith(where):
            raise EnqueueError(message) from None
        raise EnqueueError(f"{where}: {message}") from None


def read_jsonl(lines: Iterable[str], defaults: Defaults) -> Iterator[tuple[int, RequestSpec]]:
    """Yield (line number, spec) lazily; raise `EnqueueError` naming the first bad line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EnqueueError(f"line {number}: invalid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            yield number, spec_from_line(obj, defaults)
        except EnqueueError as exc:
            raise EnqueueError(f"line {number}: {exc}") from None
