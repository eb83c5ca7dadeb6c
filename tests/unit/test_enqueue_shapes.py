"""Reading both common JSONL shapes into the same provider-neutral request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ledger.enqueue import Defaults, EnqueueError, read_jsonl, to_row

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Score this."}]


def rows(lines: list[object], defaults: Defaults | None = None) -> list[dict[str, Any]]:
    text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    return [to_row(spec) for _, spec in read_jsonl(text, defaults or Defaults())]


def test_openai_batch_line_and_bare_body_store_the_same_request() -> None:
    batch_line = {
        "custom_id": "r-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": MESSAGES, "temperature": 0},
    }
    bare = {"model": "gpt-4o-mini", "messages": MESSAGES, "temperature": 0, "metadata": {"agent": "a1"}}
    first, second = rows([batch_line, bare])
    assert (
        first["input"]
        == second["input"]
        == {"system": "Be terse.", "messages": [{"role": "user", "content": "Score this."}]}
    )
    assert first["params"] == second["params"] == {"temperature": 0}
    assert first["idempotency_key"] == "r-1"
    assert str(second["idempotency_key"]).startswith("sha256:")
    assert second["trace"] == {"agent": "a1"}
    assert first["endpoint"] == "openai:gpt-4o-mini"


def test_content_hash_is_stable_and_content_sensitive() -> None:
    a = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
    b = {"model": "m", "messages": [{"role": "user", "content": "two"}]}
    ka, ka2, kb = (r["idempotency_key"] for r in rows([a, a, b]))
    assert ka == ka2 != kb


def test_anthropic_url_and_batch_line_select_anthropic() -> None:
    via_url = {"custom_id": "x", "url": "/v1/messages", "body": {"model": "claude", "messages": MESSAGES[1:]}}
    batch = {
        "custom_id": "y",
        "params": {"model": "claude", "max_tokens": 50, "system": "S", "messages": MESSAGES[1:]},
    }
    a, b = rows([via_url, batch])
    assert a["provider"] == b["provider"] == "anthropic"
    assert b["input"]["system"] == "S" and b["params"] == {"max_tokens": 50}


def test_flags_override_the_file() -> None:
    line = {"model": "gpt-4o", "messages": MESSAGES}
    (row,) = rows([line], Defaults(provider="mock", model="other", job_id="j", priority=3))
    assert (row["provider"], row["model"], row["job_id"], row["priority"]) == ("mock", "other", "j", 3)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "line 2: invalid JSON"),
        ({"model": "m"}, "line 2: missing 'messages'"),
        ({"model": "m", "messages": []}, "line 2: messages"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "line 2: messages[0].role 'robot'"),
        ({"messages": MESSAGES}, "line 2: missing 'model'"),
    ],
)
def test_bad_line_names_its_number_and_reason(line: object, reason: str) -> None:
    good = {"model": "m", "messages": MESSAGES}
    with pytest.raises(EnqueueError) as caught:
        rows([good, line])
    assert str(caught.value).startswith(reason), str(caught.value)


def test_unknown_provider_is_named() -> None:
    with pytest.raises(EnqueueError, match=r"line 1: provider: .*unknown provider 'nope'"):
        rows([{"model": "m", "messages": MESSAGES}], Defaults(provider="nope"))
