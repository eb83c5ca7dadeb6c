"""What makes two requests under one idempotency key "the same request".

A key (a `custom_id`, or the content hash) reused with the same body is a repeat and
adds nothing; reused with a different body it is a conflict, like an idempotency key
reused with different parameters, and the enqueue is refused. Without this the second
request would be skipped as "already queued" while the user believes it is in the ledger.

The body is every stored field that says what is asked and where the answer belongs
(`BODY_FIELDS`). Not in it: `priority` (a scheduling hint: enqueuing a file again with
another `--priority` is a repeat, reported as already queued) and what is derived from
the price table (`estimate_usd`), which may change between runs without the request
changing. `llm_requests.body_hash` keeps the hash; rows written before it existed
(NULL) are compared by their stored fields, hashed the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

BODY_FIELDS = (
    "job_id",
    "purpose",
    "provider",
    "model",
    "endpoint",
    "input",
    "params",
    "response_format",
    "delivery",
    "trace",
)
# A request for OpenAI's Responses API asks something else than the same input as chat.
RESPONSES = "responses"
# The columns stored as JSON: an enqueue sends them as this text (`canonical`).
JSON_FIELDS = ("input", "params", "response_format", "trace", "sources", "dropped_params")


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_STRING: Any = getattr(json.encoder, "c_encode_basestring", None) or json.encoder.py_encode_basestring


def canonical(obj: Any) -> str:
    """One text per value: sorted keys, no spaces, no NaN (JSON has none: `ValueError`).

    Strings and None, most of a request's fields, skip the encoder's set-up (an enqueue
    makes about ten of these per request)."""
    if obj is None:
        return "null"
    if type(obj) is str:
        return str(_STRING(obj))
    return _ENCODER.encode(obj)


def json_texts(row: Mapping[str, Any]) -> dict[str, str]:
    """The row's JSON columns as `canonical` text (`TypeError`/`ValueError` for a value JSON cannot hold)."""
    return {field: canonical(row.get(field)) for field in JSON_FIELDS}


def body_hash(row: Mapping[str, Any], texts: Mapping[str, str] | None = None) -> str:
    """The hex SHA-256 of a request's body fields (a row as stored, or about to be); `texts`:
    its `json_texts`, when already made. Canonical JSON holds no raw newline: one per field."""
    given = texts or {}
    parts = [given[f] if f in given else canonical(row.get(f)) for f in BODY_FIELDS]
    if row.get("api") == RESPONSES:  # only then: every other row's hash stays what it was before `api`
        parts.append(RESPONSES)
    for extra in ("parse", "sources"):  # likewise: only when set (migration 0009)
        if row.get(extra) is not None:
            value = given.get(extra) or canonical(row.get(extra))
            parts.append(f"{extra}={value}")
    if row.get("sample"):  # and a sample other than the first (migration 0010)
        parts.append(f"sample={int(row['sample'])}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


# What decides an answer (the response cache's key, with the sample): not the job, the key, the
# trace, the purpose, the priority or the delivery, which say where an answer belongs and how it
# is fetched, nor how it is parsed.
CACHE_FIELDS = ("provider", "model", "endpoint", "api", "input", "params", "response_format")


def cache_key(row: Mapping[str, Any], texts: Mapping[str, str] | None = None) -> str:
    """The hex SHA-256 of what decides a request's answer and the `sample` asked for: two
    requests with one key ask the same question for the same sample (`texts`: as `body_hash`)."""
    given = texts or {}
    parts = [given[f] if f in given else canonical(row.get(f)) for f in CACHE_FIELDS]
    parts.append(str(int(row.get("sample") or 0)))
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def differing_fields(ours: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The body fields whose values differ, for a conflict's message."""
    found = [f for f in BODY_FIELDS if canonical(ours.get(f)) != canonical(stored.get(f))]
    if (ours.get("api") == RESPONSES) != (stored.get("api") == RESPONSES):
        found.append("api")
    found += [f for f in ("parse", "sources") if canonical(ours.get(f)) != canonical(stored.get(f))]
    if int(ours.get("sample") or 0) != int(stored.get("sample") or 0):
        found.append("sample")
    return found
