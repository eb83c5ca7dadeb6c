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


def canonical(obj: Any) -> str:
    """One text per value: sorted keys, no spaces, no NaN (JSON has none: `ValueError`)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def body_hash(row: Mapping[str, Any]) -> str:
    """The hex SHA-256 of a request's body fields (a row as stored, or about to be)."""
    body = {field: row.get(field) for field in BODY_FIELDS}
    return hashlib.sha256(canonical(body).encode("utf-8", "surrogatepass")).hexdigest()


def differing_fields(ours: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """The body fields whose values differ, for a conflict's message."""
    return [f for f in BODY_FIELDS if canonical(ours.get(f)) != canonical(stored.get(f))]
