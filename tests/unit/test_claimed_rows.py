"""A claimed row as the executor gets it, whatever form its JSON columns were read in."""

from __future__ import annotations

import json
from collections import namedtuple
from typing import Any

import pytest

from ledger.events import request_labels
from ledger.store.lease_ends import CLAIMED_COLUMNS, to_claimed

Row = namedtuple("Row", [c.name for c in CLAIMED_COLUMNS])  # type: ignore[misc]
MESSAGES = {"messages": [{"role": "user", "content": "Evaluate item 7."}]}


def row(**json_columns: Any) -> Any:
    base = dict(
        id=7,
        lease_token=2,
        attempts=1,
        idempotency_key="k-7",
        job_id=None,
        provider="mock",
        model="m",
        endpoint="mock:m",
        api="chat",
        parse=None,
        parked=0,
    )
    return Row(**base, **json_columns)


@pytest.mark.parametrize("as_text", [True, False], ids=["text (SQLite's hot rows)", "parsed (psycopg's JSONB)"])
def test_a_claimed_row_carries_its_input_params_and_trace_read_as_text_or_parsed(as_text: bool) -> None:
    def stored(value: Any) -> Any:
        return json.dumps(value) if as_text else value

    trace = {"agent": "judge", "dimension": "clarity"}
    claimed = to_claimed(
        row(input=stored(MESSAGES), params=stored({"max_tokens": 5}), response_format=stored(None), trace=stored(trace))
    )
    assert (claimed.input, claimed.params, claimed.response_format) == (MESSAGES, {"max_tokens": 5}, None)
    assert claimed.trace == trace
    assert request_labels(claimed) == {"agent": "judge", "dimension": "clarity"}


@pytest.mark.parametrize("trace", [None, "null", "{}"])
def test_a_request_without_a_trace_is_named_by_its_custom_id(trace: str | None) -> None:
    """In its events: no empty agent, and its key under its own name, not as a dimension."""
    claimed = to_claimed(row(input=json.dumps(MESSAGES), params="null", response_format="null", trace=trace))
    assert claimed.params == {}
    assert request_labels(claimed) == {"custom_id": "k-7"}
