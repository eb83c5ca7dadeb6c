"""Endpoint pool keys: which requests compete for the same provider capacity.

The pool-key rules, kept exactly so limits written for one tool carry over:
`openai:gpt-4o` stays, `http://host:8080/v1` becomes `http:host:8080`, and a
bare `gpt-4o` becomes `id:gpt-4o`.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import urlsplit


def normalize_endpoint(raw: str) -> str:
    """The pool key for an endpoint string (URL, `provider:model` or bare id)."""
    value = raw.strip()
    if not value:
        raise ValueError("endpoint must not be empty")
    if "://" in value:
        parts = urlsplit(value)
        host = parts.hostname or ""
        if not parts.scheme or not host:
            raise ValueError(f"endpoint {raw!r} is not a valid URL")
        return f"{parts.scheme}:{host}:{parts.port}" if parts.port else f"{parts.scheme}:{host}"
    if ":" in value:
        return value
    return f"id:{value}"


def endpoint_for(provider: str, model: str, base_url: str | None = None, *, per_model: bool = False) -> str:
    """The default pool of a request: its server when it names one, else provider and model.

    OpenAI-compatible servers (Ollama, vLLM) are one box whatever the model, so
    they pool by URL; hosted providers rate-limit per model, so they pool by model.
    `per_model` (LEDGER_COMPATIBLE_POOLS=model): a compatible server that limits each model
    on its own (a proxy in front of several providers) has a pool per model there,
    `http:host:4000/model`, so one model's limit never holds back another's calls.
    """
    if base_url and provider == "openai-compatible":
        server = normalize_endpoint(base_url)
        return f"{server}/{model}" if per_model else server
    return normalize_endpoint(f"{provider}:{model}")


class CallsOut:
    """This process's calls per pool that have been sent and not answered yet.

    Read when a 429 comes back: the provider refused a call while these were out
    (those it had accepted and those still on their way), so it serves at most
    that many of ours. Only this process counts here; the store adds the calls
    other daemons have out, as the database knows them.
    """

    def __init__(self) -> None:
        self._out: Counter[str] = Counter()

    def add(self, pool: str, calls: int) -> None:
        """`calls` more out (a call sent), or fewer (negative: answered, failed or cut off)."""
        self._out[pool] += calls

    def now(self, pool: str) -> int:
        return self._out[pool]


CALLS_OUT = CallsOut()
