"""Input that cannot be trusted: each bad input is one line naming where and what, exit 2,
nothing written (CLI in a real process, and the Python API), on SQLite and PostgreSQL."""

from __future__ import annotations

import codecs
import json
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger import EnqueueError, Ledger, RequestSpec
from ledger.enqueue import Defaults, checked_row, read_jsonl_file, to_row
from ledger.settings import load_settings
from ledger.store import Store
from ledger.store.intake import CHUNK_ROW_COLUMNS, KeyConflict

USER = [{"role": "user", "content": "Essay {i}"}]


def line(i: int, **body: Any) -> dict[str, Any]:
    """An OpenAI Batch line with custom_id `req-{i}`; `body` overrides its body's fields."""
    messages = [dict(m, content=m["content"].format(i=i)) for m in USER]
    return {
        "custom_id": f"req-{i}",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4o-mini", "messages": messages, "max_tokens": 64, **body},
    }


def encoded(obj: object) -> bytes:
    return (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n"


def write(path: Path, lines: list[object], head: bytes = b"") -> Path:
    path.write_bytes(head + b"".join(encoded(o) for o in lines))
    return path


def cli_enqueue(db_url: str, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`ledger enqueue` in its own process, as a user runs it."""
    from tests.acceptance.procs import LEDGER, ledger_env

    return subprocess.run(
        [*LEDGER, "enqueue", str(path), "--provider", "mock"],
        env=ledger_env(db_url, None, LEDGER_LOG_LEVEL="WARNING", **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def cli_enqueue_here(db_url: str, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The same command through typer's runner, in this process: the CLI's own code, exit code
    and stderr, without a Python start-up per case (the suite has ten minutes on two cores)."""
    from typer.testing import CliRunner

    from ledger.cli import app

    settings = {"LEDGER_DATABASE_URL": db_url, "LEDGER_LOG_LEVEL": "WARNING", **env}
    done = CliRunner().invoke(app, ["enqueue", str(path), "--provider", "mock"], env=settings)
    return subprocess.CompletedProcess(["ledger", "enqueue"], done.exit_code, done.stdout, done.stderr)


def request_count(db_url: str) -> int:
    store = Store(db_url)
    try:
        with store.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM llm_requests")).scalar_one())
    finally:
        store.close()


def assert_refused(done: subprocess.CompletedProcess[str], expected: str) -> None:
    """Exit 2, and stderr is exactly one line: `error: <expected ...>`."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    message = done.stderr.strip().removeprefix("error: ")
    assert expected in message, message


NESTED = b'{"model": "m", "messages": ' + b"[" * 1500 + b"]" * 1500 + b"}"
NOT_UTF8 = b'{"custom_id": "r", "body": {"model": "m", "messages": [{"role": "user", "content": "\xff"}]}}'
BAD_LINES: dict[str, tuple[object, str]] = {
    "not utf-8": (NOT_UTF8, f"bad.jsonl:3: not UTF-8 (byte 0xff at column {NOT_UTF8.index(0xFF) + 1})"),
    "not an object": ([1, 2, 3], "bad.jsonl:3: line is not a JSON object"),
    "invalid json": (b'{"custom_id": ', "bad.jsonl:3: invalid JSON (Expecting value at column 15)"),
    "nested too deeply": (NESTED, "bad.jsonl:3: invalid JSON (nested too deeply)"),
    "custom_id reused, other body": (
        line(1, max_tokens=65),
        "bad.jsonl:3: custom_id 'req-1' was already used with a different body (line 1)",
    ),
    "oversized line": (
        line(9, messages=[{"role": "user", "content": "x" * 5000}]),
        "bad.jsonl:3: line is longer than 4096 bytes (LEDGER_MAX_LINE_BYTES)",
    ),
    "max_tokens zero": (
        line(9, max_tokens=0),
        "bad.jsonl:3: params.max_tokens: must be an integer in 1..1000000, got 0",
    ),
    "max_tokens absurd": (
        line(9, max_tokens=10**9),
        "bad.jsonl:3: params.max_tokens: must be an integer in 1..1000000, got 1000000000",
    ),
    "temperature": (line(9, temperature=7), "bad.jsonl:3: params.temperature: must be a number in 0..2, got 7"),
    "top_p text": (line(9, top_p="high"), "bad.jsonl:3: params.top_p: must be a number in 0..1, got 'high'"),
    "n": (line(9, n=4), "bad.jsonl:3: params.n: only 1 is supported"),
    "NaN": (
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": {"w": NaN}}',
        "bad.jsonl:3: trace: holds NaN or an infinite number (not JSON)",
    ),
    "NUL": (
        line(9, messages=[{"role": "user", "content": "a\x00b"}]),
        "bad.jsonl:3: input: holds a NUL character (\\u0000), which PostgreSQL cannot store",
    ),
    "unpaired surrogate": (
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "bad.jsonl:3: input: holds an unpaired surrogate ('\\ud800'), not UTF-8",
    ),
    "custom_id too long": (
        {**line(9), "custom_id": "k" * 201},
        "bad.jsonl:3: custom_id must be 1 to 200 characters, got 201",
    ),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_bad_line_is_one_line_exit_2_and_nothing_written(sqlite_url: str, tmp_path: Path, case: str) -> None:
    """The whole file is checked before anything is written, so the database plays no part in
    these refusals: each runs once, on SQLite, through the CLI in this process (the next test
    runs some in a process of their own, on both databases)."""
    bad, expected = BAD_LINES[case]
    path = write(tmp_path / "bad.jsonl", [line(1), line(2), bad, line(4)])
    assert_refused(cli_enqueue_here(sqlite_url, path, LEDGER_MAX_LINE_BYTES="4096"), expected)
    assert request_count(sqlite_url) == 0


@pytest.mark.parametrize("case", ["not utf-8", "custom_id reused, other body", "NUL"])
def test_a_bad_line_writes_nothing_on_either_database(db_url: str, tmp_path: Path, case: str) -> None:
    bad, expected = BAD_LINES[case]
    path = write(tmp_path / "bad.jsonl", [line(1), line(2), bad, line(4)])
    assert_refused(cli_enqueue(db_url, path), expected)
    assert request_count(db_url) == 0


def test_a_utf16_file_is_named_as_such(sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(codecs.BOM_UTF16_LE + json.dumps(line(1)).encode("utf-16-le"))
    assert_refused(
        cli_enqueue(sqlite_url, path), "bad.jsonl:1: not UTF-8 (the file starts with a UTF-16 byte-order mark"
    )
    assert request_count(sqlite_url) == 0


def test_a_utf8_bom_is_accepted(sqlite_url: str, tmp_path: Path) -> None:
    path = write(tmp_path / "bom.jsonl", [line(1), line(2)], head=codecs.BOM_UTF8)
    done = cli_enqueue(sqlite_url, path)
    assert done.returncode == 0, done.stderr
    assert "enqueued 2 request(s)" in done.stdout
    assert Store(sqlite_url).id_for_key("req-1") > 0  # the BOM is not part of the first key


def test_a_custom_id_reused_against_the_ledger_is_a_conflict(db_url: str, tmp_path: Path) -> None:
    """A later file reusing a custom_id with another body is refused, naming the request it
    collides with and what differs; the same body again is a silent repeat."""
    first = write(tmp_path / "first.jsonl", [line(1), line(2)])
    assert cli_enqueue(db_url, first).returncode == 0
    later = write(tmp_path / "later.jsonl", [line(3), line(2, messages=[{"role": "user", "content": "edited"}])])
    assert_refused(
        cli_enqueue(db_url, later),
        "later.jsonl:2: custom_id 'req-2' is already in the ledger (request 2) with a different body (input differs)",
    )
    assert request_count(db_url) == 2  # not even req-3, which came before the conflict
    again = write(tmp_path / "again.jsonl", [line(3), line(2)])
    done = cli_enqueue(db_url, again)
    assert done.returncode == 0, done.stderr
    assert "enqueued 1 request(s), 1 already queued (skipped); 3 queued in total" in done.stdout


def test_a_conflict_past_the_first_chunk_still_writes_nothing(db_url: str, tmp_path: Path) -> None:
    """An input of several transactions is checked against the ledger whole before the first."""
    assert cli_enqueue(db_url, write(tmp_path / "one.jsonl", [line(5999)])).returncode == 0
    lines: list[object] = [line(i) for i in range(6000)]
    lines[5999] = line(5999, temperature=1)
    assert_refused(
        cli_enqueue(db_url, write(tmp_path / "big.jsonl", lines)),
        "big.jsonl:6000: custom_id 'req-5999' is already in the ledger (request 1)"
        " with a different body (params differs)",
    )
    assert request_count(db_url) == 1


def test_an_enqueue_cut_half_way_completes_when_run_again(db_url: str, tmp_path: Path) -> None:
    """What a crash between chunks leaves (a prefix of the file) is skipped by a second run."""
    lines: list[object] = [line(i) for i in range(7000)]
    assert cli_enqueue(db_url, write(tmp_path / "half.jsonl", lines[:3500])).returncode == 0
    done = cli_enqueue(db_url, write(tmp_path / "all.jsonl", lines))
    assert done.returncode == 0, done.stderr
    assert "enqueued 3500 request(s), 3500 already queued (skipped); 7000 queued in total" in done.stdout
    store = Store(db_url)
    with store.engine.connect() as conn:
        seqs = conn.execute(text("SELECT fair_seq FROM llm_requests ORDER BY id")).scalars().all()
    store.close()
    # Claims keep the file's order across runs and chunks (numbers a repeat took may be skipped).
    assert len(seqs) == 7000 and seqs == sorted(set(seqs)) and seqs[0] == 1


def test_rows_from_before_the_body_hash_are_compared_by_their_fields(db_url: str, tmp_path: Path) -> None:
    assert cli_enqueue(db_url, write(tmp_path / "old.jsonl", [line(1)])).returncode == 0
    store = Store(db_url)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE llm_requests SET body_hash = NULL"))  # as migration 0005 leaves them
    store.close()
    done = cli_enqueue(db_url, write(tmp_path / "same.jsonl", [line(1)]))
    assert done.returncode == 0 and "1 already queued" in done.stdout, done.stderr
    assert_refused(
        cli_enqueue(db_url, write(tmp_path / "other.jsonl", [line(1, model="gpt-4o")])),
        "other.jsonl:1: custom_id 'req-1' is already in the ledger (request 1)"
        " with a different body (model, endpoint differ)",
    )


def test_a_conflict_found_inside_a_chunk_rolls_the_chunk_back(db_url: str) -> None:
    """The check inside the insert's transaction (a key taken by a concurrent enqueue since
    the input was checked): nothing of the chunk is written."""
    settings = load_settings()
    store = Store(db_url)
    with Ledger(db_url, settings=settings) as ledger:
        ledger.enqueue(model="m", provider="mock", messages=[{"role": "user", "content": "a"}], idempotency_key="k")
    specs = [spec(c, idempotency_key=k) for k, c in (("new", "n"), ("k", "b"))]
    checked = [checked_row(s) for s in specs]
    rows = [
        tuple(1 if c == "fair_seq" else texts.get(c, row.get(c)) for c in CHUNK_ROW_COLUMNS) for row, texts in checked
    ]
    with pytest.raises(KeyConflict) as caught:
        store.insert_chunk(rows, {row["idempotency_key"]: row["body_hash"] for row, _ in checked}, set())
    assert caught.value.key == "k"
    assert request_count(db_url) == 1
    store.close()


# -- the Python API -------------------------------------------------------------------------


def spec(content: str = "hi", **fields: Any) -> RequestSpec:
    return RequestSpec(
        **{"model": "m", "provider": "mock", "messages": [{"role": "user", "content": content}], **fields}
    )


API_BAD: dict[str, tuple[Callable[[], Any], str]] = {
    "params": (lambda: spec(params={"temperature": 5}), "params.temperature: must be a number in 0..2, got 5"),
    "n": (lambda: spec(params={"n": 2}), "params.n: only 1 is supported"),
    "priority": (lambda: spec(priority=2**40), "priority: Input should be less than or equal to 2147483647"),
    "key length": (
        lambda: spec(idempotency_key="k" * 201),
        "idempotency_key: String should have at most 200 characters",
    ),
    "no user message": (
        lambda: RequestSpec(model="m", messages=[{"role": "system", "content": "s"}]),
        "messages: needs at least one user message",
    ),
    "assignment": (
        lambda: setattr(spec(), "params", {"max_tokens": -1}),
        "params.max_tokens: must be an integer in 1..1000000, got -1",
    ),
}


@pytest.mark.parametrize("case", list(API_BAD))
def test_a_bad_spec_raises_one_line(case: str) -> None:
    make, expected = API_BAD[case]
    with pytest.raises(EnqueueError) as caught:
        make()
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), str(caught.value)


API_BAD_BATCH: dict[str, tuple[object, str]] = {
    "not an object": (
        "Grade this essay",
        "requests[2]: not a request: expected a RequestSpec or a mapping of its fields, got str",
    ),
    "mapping with a bad field": (
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temprature": 0.5},
        "requests[2]: temprature: Extra inputs are not permitted",
    ),
    "a field named self": (
        {"self": 1, "model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "requests[2]: self: Extra inputs are not permitted",
    ),
    "message not an object": (
        {"model": "m", "messages": ["hi"]},
        "requests[2]: messages.0: Input should be a valid dictionary",
    ),
    "unpaired surrogate": (spec("a\ud800b"), "requests[2]: input: holds an unpaired surrogate ('\\ud800'), not UTF-8"),
    "NaN": (spec(trace={"w": float("nan")}), "requests[2]: trace: holds NaN or an infinite number (not JSON)"),
    "not JSON": (
        spec(trace={"at": datetime(2026, 1, 1)}),
        "requests[2]: trace: not JSON (Object of type datetime is not JSON serializable)",
    ),
    "NUL": (spec("a\x00b"), "requests[2]: input: holds a NUL character"),
    "too big": (spec("x" * 5000), "requests[2]: request is "),
    "key reused": (
        spec("other", idempotency_key="k0"),
        "requests[2]: idempotency_key 'k0' was already used with a different body (requests[0])",
    ),
}


@pytest.mark.parametrize("case", list(API_BAD_BATCH))
def test_a_bad_batch_from_python_writes_nothing(db_url: str, case: str) -> None:
    bad, expected = API_BAD_BATCH[case]
    settings = load_settings(LEDGER_MAX_LINE_BYTES=4096)
    with Ledger(db_url, settings=settings) as ledger:
        with pytest.raises(EnqueueError) as caught:
            # `bad` may be anything a caller hands over, not only what the signature names
            ledger.enqueue_many([spec("a", idempotency_key="k0"), spec("b"), bad, spec("d")])  # type: ignore[list-item]
        assert str(caught.value).startswith(expected), str(caught.value)
    assert request_count(db_url) == 0


def test_a_mapping_is_enqueued_like_the_spec_it_spells(db_url: str) -> None:
    fields = {"model": "m", "provider": "mock", "messages": [{"role": "user", "content": "hi"}]}
    with Ledger(db_url, settings=load_settings()) as ledger:
        first = ledger.enqueue(fields)
        assert ledger.enqueue(RequestSpec(**fields)) == first  # the same request: a repeat
        result = ledger.enqueue_many([fields, {**fields, "messages": [{"role": "user", "content": "other"}]}])
        assert (result.inserted, result.duplicates) == (1, 1)
        with pytest.raises(EnqueueError) as caught:
            ledger.enqueue(fields, model="other")
        assert str(caught.value) == "give a request spec or its fields, not both (fields: model)"
        with pytest.raises(EnqueueError) as caught:
            ledger.enqueue_many(fields)  # type: ignore[arg-type]
        assert str(caught.value) == "enqueue_many takes a list of requests, got one dict"
    assert request_count(db_url) == 2


def test_python_key_reused_against_the_ledger(db_url: str) -> None:
    with Ledger(db_url, settings=load_settings()) as ledger:
        first = ledger.enqueue(spec("a", idempotency_key="k", params={"max_tokens": 10}))
        assert ledger.enqueue(spec("a", idempotency_key="k", params={"max_tokens": 10})) == first  # a repeat
        with pytest.raises(EnqueueError) as caught:
            ledger.enqueue(spec("a", idempotency_key="k", params={"max_tokens": 20}))
        assert str(caught.value) == (
            f"idempotency_key 'k' is already in the ledger (request {first}) with a different body (params differs)"
        )
        with pytest.raises(EnqueueError) as caught:
            ledger.enqueue_many([spec("new"), spec("a", idempotency_key="k", delivery="batch")])
        assert str(caught.value).startswith("requests[1]: idempotency_key 'k' is already in the ledger")
    assert request_count(db_url) == 1


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_large_file_checked_on_several_cores_names_its_first_bad_line(
    db_url: str, tmp_path: Path, workers: str
) -> None:
    """A file of several blocks is checked by worker processes; the line named is still the first
    bad one in the file (not the first a worker found), with the words an in-process check
    uses, and nothing is written."""
    lines: list[object] = [line(i) for i in range(4500)]
    lines[3800] = line(3800, temperature=9)  # in a later block: a worker may reach it first
    lines[2200] = line(2200, n=4)
    path = write(tmp_path / "bad.jsonl", lines)
    assert_refused(
        cli_enqueue(db_url, path, LEDGER_ENQUEUE_WORKERS=workers),
        f"{path}:2201: params.n: only 1 is supported",
    )
    assert request_count(db_url) == 0


def test_a_large_file_checked_on_several_cores_is_stored_as_checked_here(db_url: str, tmp_path: Path) -> None:
    """The rows workers made are the rows an in-process check makes, in the file's order."""
    lines: list[object] = [line(i) for i in range(2500)]
    path = write(tmp_path / "many.jsonl", lines)
    done = cli_enqueue(db_url, path, LEDGER_ENQUEUE_WORKERS="2")
    assert done.returncode == 0, done.stderr
    fields = "idempotency_key, body_hash, cache_key, batch_key, token_estimate, fair_seq"
    store = Store(db_url)
    with store.engine.connect() as conn:
        stored = [tuple(r) for r in conn.execute(text(f"SELECT {fields} FROM llm_requests ORDER BY id"))]
    store.close()
    settings = load_settings(LEDGER_DATABASE_URL=db_url)
    here = [to_row(spec, None, settings.prices) for _, spec in read_jsonl_file(path, Defaults(provider="mock"))]
    expected = [
        (r["idempotency_key"], r["body_hash"], r["cache_key"], r["batch_key"], r["token_estimate"], seq)
        for seq, r in enumerate(here, start=1)
    ]
    assert stored == expected


def test_a_worker_killed_while_checking_lines_ends_the_enqueue_with_nothing_written(
    db_url: str, tmp_path: Path
) -> None:
    """A worker dies outright (SIGKILL, as the kernel's out-of-memory killer would) while it
    checks a block: the enqueue stops with one line instead of waiting for it forever."""
    path = write(tmp_path / "many.jsonl", [line(i) for i in range(3500)])
    done = cli_enqueue(db_url, path, LEDGER_ENQUEUE_WORKERS="2", LEDGER_STOP_AT="checking_lines")
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert "a process checking its lines stopped unexpectedly; nothing was written" in done.stderr
    assert request_count(db_url) == 0
