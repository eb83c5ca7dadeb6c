"""Audit commands and the SQL of docs/audit.md on a populated ledger (both databases)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sqlalchemy import text
from typer.testing import CliRunner

from adapters.base import CallResult
from ledger.cli import app
from ledger.enqueue import build_spec, to_row
from ledger.store import Store
from ledger.store.rows import AttemptFailure, Completed, Failed, RetryLater

AUDIT_DOC = Path(__file__).parents[2] / "docs" / "audit.md"


def populate(url: str) -> dict[str, int]:
    """Three requests: one completed after a 429, one failed with 401, one still queued."""
    store = Store(url)
    store.enqueue(
        to_row(
            build_spec(
                model="gpt-4o-mini",
                provider="mock",
                job_id="audit",
                idempotency_key=f"k{i}",
                messages=[{"role": "user", "content": f"q{i}"}],
                trace={"agent": "judge", "dimension": f"d{i}"},
            )
        )
        for i in range(3)
    )
    limits = {"lease_seconds": 30, "global_limit": 2, "pool_limit": lambda _: 2, "max_attempts": 3, "max_claims": 1}
    (ok,) = store.claim("w", **limits).requests
    # Refused with one other call out: the pool learns its limit (decision 50).
    store.record([RetryLater(ok, 1, AttemptFailure(429, "rate_limit", "slow down", 12), delay_s=0.0, calls_out=1)])
    assert store.begin_attempt(ok).number == 2
    text_out = "Reasoning...\nVERDICT: 4"
    answer = CallResult(
        text_out, 20, 7, finish_reason="length", provider_finish_reason="length", cached_input_tokens=16
    )
    store.record([Completed(ok, 2, text_out, 150, input_tokens=20, output_tokens=7, cost_usd=0.5, answer=answer)])
    (bad,) = store.claim("w", **limits).requests
    store.record([Failed(bad, 1, AttemptFailure(401, "invalid_api_key", "401: bad key", 9), elapsed_ms=9)])
    store.close()
    return {"ok": ok.id, "bad": bad.id}


def cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"LEDGER_DATABASE_URL": url})
    assert result.exit_code == 0, result.output
    return result.output


def test_requests_show_export_and_status(db_url: str, tmp_path: Path) -> None:
    ids = populate(db_url)
    listed = [json.loads(line) for line in cli(db_url, "requests", "--json").splitlines()]
    assert [r["status"] for r in listed] == ["completed", "error", "queued"]
    assert listed[0]["attempts"] == 2 and listed[0]["input_tokens"] == 20
    errors = [json.loads(line) for line in cli(db_url, "requests", "--status", "error", "--json").splitlines()]
    assert [r["id"] for r in errors] == [ids["bad"]]

    shown = json.loads(cli(db_url, "show", str(ids["ok"]), "--json"))
    assert [(a["attempt"], a["outcome"], a["status_code"]) for a in shown["attempt_rows"]] == [
        (1, "failed", 429),
        (2, "succeeded", 200),
    ]
    assert "VERDICT: 4" in cli(db_url, "show", str(ids["ok"]))

    out = tmp_path / "export.jsonl"
    cli(db_url, "export", "--job", "audit", "--out", str(out))
    exported = {line["custom_id"]: line for line in map(json.loads, out.read_text().splitlines())}
    assert exported["k0"]["output"].endswith("VERDICT: 4")
    assert exported["k0"]["usage"] == {
        "input_tokens": 20,
        "output_tokens": 7,
        "cached_input_tokens": 16,
        "cache_write_tokens": None,
        "reasoning_tokens": None,
    }
    assert (exported["k0"]["finish_reason"], exported["k0"]["provider_finish_reason"]) == ("length", "length")
    assert "response" not in exported["k0"]  # the body only with --full
    assert exported["k1"]["error"] == {
        "code": "invalid_api_key",
        "message": "401: bad key",
        "status_code": 401,
    }
    assert exported["k2"]["status"] == "queued"

    status = cli(db_url, "status")
    assert "completed 1" in status and "error 1" in status and "queued 1" in status
    assert "cancel pending" not in status


def test_status_tells_a_cancel_waiting_for_its_call(db_url: str) -> None:
    populate(db_url)
    store = Store(db_url)
    limits = {"lease_seconds": 30, "global_limit": 2, "pool_limit": lambda _: 2, "max_attempts": 3, "max_claims": 1}
    (running,) = store.claim("w", **limits).requests
    store.cancel(ids=[running.id])
    store.close()
    status = cli(db_url, "status", "--job", "audit")
    assert "running 1" in status and "1 running with a cancel pending" in status


def test_show_unknown_id_is_a_clear_error(sqlite_url: str) -> None:
    Store(sqlite_url).close()
    result = CliRunner().invoke(app, ["show", "999"], env={"LEDGER_DATABASE_URL": sqlite_url})
    assert result.exit_code == 1 and "no request with id 999" in result.output


def test_readme_audit_queries_run_and_answer(db_url: str) -> None:
    ids = populate(db_url)
    queries = re.findall(r"```sql\n(.*?)```", AUDIT_DOC.read_text(), flags=re.S)
    assert len(queries) == 6
    store = Store(db_url)
    with store.engine.connect() as conn:
        saw_429, spend, batches, in_flight, not_stopped, cache = (
            conn.execute(text(q)).mappings().all() for q in queries
        )
    store.close()
    assert [dict(r) for r in not_stopped] == [
        {"model": "gpt-4o-mini", "finish_reason": "length", "answers": 1, "cached_input_tokens": 16, "cost_usd": 0.5}
    ]
    assert [(r["id"], r["status"], r["rate_limited_attempts"]) for r in saw_429] == [(ids["ok"], "completed", 1)]
    assert [(r["model"], r["requests"], r["input_tokens"]) for r in spend] == [("gpt-4o-mini", 1, 20)]
    assert in_flight == [] and batches == []  # batches: see test_provider_batches
    assert cache == []  # cache savings: see test_response_cache


def test_ledger_counts_behind_the_metrics_gauges(db_url: str) -> None:
    """Per pool and status; queue depth leaves out a request in back-off; the learned limit as stored."""
    populate(db_url)
    store = Store(db_url)
    try:
        pool = "mock:gpt-4o-mini"
        assert store.ledger_counts().due == {pool: 1}
        limits = {"lease_seconds": 30, "global_limit": 2, "pool_limit": lambda _: 2, "max_attempts": 3, "max_claims": 1}
        (waiting,) = store.claim("w", **limits).requests
        failure = AttemptFailure(503, "unavailable", "later", 5)
        store.record([RetryLater(waiting, 1, failure, delay_s=600.0, hold_slot=False)])
        counts = store.ledger_counts()
        assert counts.requests == {(pool, "completed"): 1, (pool, "error"): 1, (pool, "queued"): 1}
        assert counts.due == {}  # queued, but not due for ten minutes
        learned = store.pool_usage()[pool]["learned_limit"]
        assert learned is not None and counts.learned_limits == {pool: learned}
    finally:
        store.close()
