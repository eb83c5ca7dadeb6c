"""`ledger enqueue`: both shapes, idempotency, all-or-nothing on a bad line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger.cli import app
from ledger.store import Store

MESSAGES = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Essay {i}"}]


def write_jsonl(path: Path, objs: Sequence[object]) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def batch_line(i: int) -> dict[str, object]:
    messages = [dict(m, content=str(m["content"]).format(i=i)) for m in MESSAGES]
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": messages, "max_tokens": 64},
    }


def bare_line(i: int) -> dict[str, object]:
    messages = [dict(m, content=str(m["content"]).format(i=i)) for m in MESSAGES]
    return {"model": "gpt-4o-mini", "messages": messages, "metadata": {"agent": "a", "dimension": f"d{i}"}}


def enqueue(db_url: str, path: Path, *flags: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["enqueue", str(path), *flags], env={"LEDGER_DATABASE_URL": db_url})
    return result.exit_code, result.output


def test_both_shapes_are_enqueued(db_url: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mixed.jsonl", [batch_line(1), bare_line(2), batch_line(3)])
    code, output = enqueue(db_url, path, "--job", "eval-1", "--provider", "mock")
    assert code == 0, output
    assert "enqueued 3 request(s)" in output
    store = Store(db_url)
    rows = store.list_requests(job_id="eval-1")
    assert [r["status"] for r in rows] == ["queued"] * 3
    assert rows[0]["idempotency_key"] == "req-1"
    second = store.get_request(rows[1]["id"])
    assert second is not None
    assert second["trace"] == {"agent": "a", "dimension": "d2"}
    assert second["input"]["system"] == "Judge."
    assert second["endpoint"] == "mock:gpt-4o-mini"
    store.close()


def test_enqueuing_the_same_file_twice_adds_nothing(db_url: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", [batch_line(i) for i in range(5)] + [bare_line(9)])
    assert enqueue(db_url, path)[0] == 0
    code, output = enqueue(db_url, path)
    assert code == 0
    assert "enqueued 0 request(s), 6 already queued (skipped)" in output
    store = Store(db_url)
    assert sum(store.status_counts().values()) == 6
    store.close()


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("{oops", "bad.jsonl:3: invalid JSON"),
        ({"model": "gpt-4o-mini"}, "bad.jsonl:3: missing 'messages'"),
        ("unknown-provider", "bad.jsonl:1: provider: unknown provider 'nope'"),
    ],
)
def test_a_bad_line_writes_nothing_and_exits_2(db_url: str, tmp_path: Path, bad: object, reason: str) -> None:
    if bad == "unknown-provider":
        bad = {"model": "m", "messages": MESSAGES[1:]}
        lines: list[object] = [bare_line(1), bare_line(2), {"custom_id": "z", "body": bad}]
        path = write_jsonl(tmp_path / "bad.jsonl", lines)
        code, output = enqueue(db_url, path, "--provider", "nope")
    else:
        path = write_jsonl(tmp_path / "bad.jsonl", [bare_line(1), bare_line(2), bad, bare_line(4)])
        code, output = enqueue(db_url, path)
    assert code == 2
    assert reason in " ".join(output.split())
    assert "Traceback" not in output
    store = Store(db_url)
    assert sum(store.status_counts().values()) == 0
    store.close()


def test_large_batches_roll_back_whole(sqlite_url: str, tmp_path: Path) -> None:
    """The bad line comes after several insert batches were already sent: still nothing is kept."""
    lines: list[object] = [bare_line(i) for i in range(2500)] + ["not json"]
    code, output = enqueue(sqlite_url, write_jsonl(tmp_path / "big.jsonl", lines))
    assert code == 2 and "big.jsonl:2501: invalid JSON" in output
    store = Store(sqlite_url)
    assert sum(store.status_counts().values()) == 0
    store.close()
