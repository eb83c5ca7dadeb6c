"""The response cache on both databases, through the real SDKs against the mock provider: hits at
enqueue, twins in flight (online and in provider batches), what is never a source, opting out,
samples, and what a hit costs and saves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, text, update
from typer.testing import CliRunner

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from ledger.api import Ledger
from ledger.cli import app
from ledger.settings import Settings
from ledger.store import Store
from ledger.store import dialect as dialect_module
from tests.integration.batch_helpers import batch_settings, requests_t, rows, run

AUDIT_DOC = Path(__file__).parents[2] / "docs" / "audit.md"


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.1) as server:
        yield server


def question(i: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"Grade essay {i}. End with VERDICT: <1-5>."}],
        "params": {"temperature": 0.7, "max_tokens": 200},
        **more,
    }


def calls(mock: RunningMockProvider) -> int:
    """Model calls the provider answered: online, and the lines of its batches."""
    stats = mock.server.stats()
    return int(stats["calls"]) + int(stats.get("batch_lines", 0))


def flat(output: str) -> str:
    """A command's output with the terminal's line wrapping undone."""
    return " ".join(output.split())


def all_rows(settings: Settings) -> list[dict[str, Any]]:
    store = Store(settings.database_url)
    try:
        return rows(store, requests_t)
    finally:
        store.close()


def test_an_answer_the_ledger_holds_is_copied_at_enqueue_not_called_again(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        first = ledger.enqueue(question(idempotency_key="run-1:q", job_id="run-1"))
        run(settings)
        assert calls(mock) == 1
        # The same question under another key, job, trace and priority: answered at once.
        again = ledger.enqueue_many(
            [question(idempotency_key="run-2:q", job_id="run-2", trace={"stage": "two"}, priority=5)]
        )
        assert (again.inserted, again.cached, again.queue_depth) == (1, 1, 0)
        run(settings)
    assert calls(mock) == 1
    source, copy = all_rows(settings)
    assert source["id"] == first and copy["cached_from"] == first and source["cached_from"] is None
    assert copy["status"] == "completed" and copy["attempts"] == 0
    for column in ("raw_output", "response", "finish_reason", "input_tokens", "output_tokens", "cache_key"):
        assert copy[column] == source[column], column
    assert source["cost_usd"] > 0 and copy["cost_usd"] == 0


def test_thirty_identical_bodies_make_one_call_and_thirty_samples_thirty(
    db_url: str, mock: RunningMockProvider
) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        twins = ledger.enqueue_many([question(idempotency_key=f"same:{i}") for i in range(30)])
        assert (twins.inserted, twins.cached, twins.twins) == (30, 0, 29)
        run(settings)
        assert calls(mock) == 1
        samples = ledger.enqueue_many([question(1, idempotency_key=f"sample:{i}", sample=i) for i in range(30)])
        assert (samples.inserted, samples.twins) == (30, 0)
        run(settings)
    assert calls(mock) == 31
    found = all_rows(settings)
    same = [r for r in found if r["idempotency_key"].startswith("same:")]
    assert all(r["status"] == "completed" for r in found)
    assert len({r["raw_output"] for r in same}) == 1
    original = next(r for r in same if r["cached_from"] is None)
    assert all(r["cached_from"] == original["id"] and r["twin_of"] is None for r in same if r is not original)
    assert sum(1 for r in found if r["cached_from"] is None and r["idempotency_key"].startswith("sample:")) == 30


def test_twins_never_share_a_provider_batch_and_complete_from_it(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many([question(idempotency_key=f"b:{i}", delivery="batch") for i in range(5)])
        run(settings)
    found = all_rows(settings)
    assert calls(mock) == 1 and mock.server.stats()["calls"] == 0  # one batch line, no online call
    assert sum(1 for r in found if r["batch_id"] is not None) == 1
    assert all(r["status"] == "completed" for r in found)
    assert sum(1 for r in found if r["cached_from"] is not None) == 4


def test_an_error_or_a_cut_off_answer_is_never_a_source(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, RETRY_MAX_ATTEMPTS=1)
    failing = question(9, idempotency_key="fails:1")
    failing["messages"][0]["content"] += " [[mock:fail=400x*]]"
    cut = question(8, idempotency_key="cut:1", params={"max_tokens": 3})
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many([failing, cut])
        run(settings)
        assert calls(mock) == 2
        again = ledger.enqueue_many([{**failing, "idempotency_key": "fails:2"}, {**cut, "idempotency_key": "cut:2"}])
        assert again.cached == 0
        run(settings)
    assert calls(mock) == 4
    statuses = {r["idempotency_key"]: (r["status"], r["finish_reason"], r["cached_from"]) for r in all_rows(settings)}
    assert statuses["fails:2"][0] == "error" and statuses["fails:2"][2] is None
    assert statuses["cut:2"] == ("completed", "length", None)


def test_when_the_original_fails_its_twins_are_called_once(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock, RETRY_MAX_ATTEMPTS=1)
    failing = question(7)
    failing["messages"][0]["content"] += " [[mock:fail=400x*]]"
    with Ledger(settings=settings) as ledger:
        result = ledger.enqueue_many([{**failing, "idempotency_key": f"f:{i}"} for i in range(3)])
        assert result.twins == 2
        run(settings)
    # The original failed; its first twin was called (failing too), then the last: one call each,
    # never two at once for the same question.
    found = all_rows(settings)
    assert calls(mock) == 3 and all(r["status"] == "error" and r["twin_of"] is None for r in found)


def test_cache_off_calls_every_request_and_a_cache_off_answer_is_still_a_source(
    db_url: str, mock: RunningMockProvider
) -> None:
    off = batch_settings(db_url, mock, LEDGER_CACHE="off")
    with Ledger(settings=off) as ledger:
        result = ledger.enqueue_many([question(idempotency_key=f"off:{i}") for i in range(3)])
        assert (result.cached, result.twins) == (0, 0)
        run(off)
    assert calls(mock) == 3
    on = batch_settings(db_url, mock)
    with Ledger(settings=on) as ledger:
        ledger.enqueue(question(idempotency_key="opted-out", cache=False))
        hit = ledger.enqueue_many([question(idempotency_key="allowed")])
        run(on)
    assert calls(mock) == 4 and hit.cached == 1
    found = {r["idempotency_key"]: r for r in all_rows(on)}
    assert found["opted-out"]["cached_from"] is None and found["opted-out"]["use_cache"] in (False, 0)
    assert found["allowed"]["cached_from"] == found["off:0"]["id"]


def test_the_key_holds_what_decides_the_answer_and_nothing_else(db_url: str, mock: RunningMockProvider) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        ledger.enqueue(question(idempotency_key="base"))
        run(settings)
        same = [
            question(idempotency_key="k:job", job_id="another"),
            question(idempotency_key="k:trace", trace={"x": 1}),
            question(idempotency_key="k:priority", priority=3),
            question(idempotency_key="k:purpose", purpose="other"),
        ]
        changed = [
            question(idempotency_key="c:model", model="gpt-4o"),
            question(idempotency_key="c:provider", provider="openai-compatible"),
            question(idempotency_key="c:input", messages=[{"role": "user", "content": "another question"}]),
            question(idempotency_key="c:system", system="be brief"),
            question(idempotency_key="c:params", params={"temperature": 0.1, "max_tokens": 200}),
            question(idempotency_key="c:format", response_format={"type": "json_object"}),
            question(idempotency_key="c:api", api="responses"),
            question(idempotency_key="c:sample", sample=1),
        ]
        assert ledger.enqueue_many(same).cached == len(same)
        assert ledger.enqueue_many(changed).cached == 0


def test_a_copy_is_never_a_source_and_the_status_counts_what_hits_saved(
    db_url: str, mock: RunningMockProvider, tmp_path: Path
) -> None:
    settings = batch_settings(db_url, mock)
    with Ledger(settings=settings) as ledger:
        original = ledger.enqueue(question(idempotency_key="o"))
        run(settings)
        ledger.enqueue(question(idempotency_key="copy-1"))
        # Make the original look like no source any more: a later request must not copy the copy.
        store = ledger.store
        with store.engine.begin() as conn:
            conn.execute(update(requests_t).where(requests_t.c.id == original).values(finish_reason="length"))
        ledger.enqueue(question(idempotency_key="copy-2"))
    found = {r["idempotency_key"]: r for r in all_rows(settings)}
    assert found["copy-1"]["cached_from"] == original
    assert found["copy-2"]["status"] == "queued" and found["copy-2"]["cached_from"] is None
    with Ledger(settings=settings) as ledger, ledger.store.engine.begin() as conn:
        conn.execute(update(requests_t).where(requests_t.c.id == original).values(finish_reason="stop"))
        hits = conn.execute(select(requests_t.c.id).where(requests_t.c.cached_from.is_not(None))).all()
    assert len(hits) == 1
    env = {"LEDGER_DATABASE_URL": db_url}
    status = CliRunner().invoke(app, ["status", "--json"], env=env)
    assert status.exit_code == 0, status.output
    cache = json.loads(status.stdout)["cache"]
    assert cache["hits_today"] == 1
    assert cache["saved_usd_today"] == pytest.approx(found["o"]["cost_usd"])
    # The audit query of what the cache saved (docs/audit.md): the one hit, at its source's cost.
    query = re.findall(r"```sql\n(.*?)```", AUDIT_DOC.read_text(), flags=re.S)[-1]
    assert "cached_from" in query
    with Ledger(settings=settings) as ledger, ledger.store.engine.connect() as conn:
        saved = [dict(r) for r in conn.execute(text(query)).mappings()]
    assert [(r["model"], r["hits"]) for r in saved] == [("gpt-4o-mini", 1)]
    assert saved[0]["saved_usd"] == pytest.approx(found["o"]["cost_usd"])
    exported = CliRunner().invoke(app, ["export"], env=env)
    lines = {json.loads(line)["custom_id"]: json.loads(line) for line in exported.stdout.splitlines() if line}
    assert lines["copy-1"]["cached_from"] == original and lines["o"]["cached_from"] is None


def test_the_command_line_says_what_the_cache_did_and_lines_opt_out_or_ask_for_samples(
    db_url: str, mock: RunningMockProvider, tmp_path: Path
) -> None:
    settings = batch_settings(db_url, mock)
    env = {"LEDGER_DATABASE_URL": db_url, "OPENAI_BASE_URL": mock.openai_base_url, "OPENAI_API_KEY": "k"}
    body = question(3)
    first = tmp_path / "first.jsonl"
    first.write_text("".join(json.dumps({"custom_id": f"a{i}", "body": body}) + "\n" for i in range(3)))
    said = CliRunner().invoke(app, ["enqueue", str(first)], env=env)
    assert said.exit_code == 0, said.output
    assert "enqueued 3 request(s), 2 waiting for an identical request in flight; 3 queued in total" in flat(said.output)
    run(settings)
    assert calls(mock) == 1
    second = tmp_path / "second.jsonl"
    lines = [
        {"custom_id": "b0", "body": body},  # answered from the cache
        {"custom_id": "b1", "body": body, "cache": False},  # called: this line opted out
        {"custom_id": "b2", "body": body, "sample": 1},  # called: another sample
        {**body, "sample": 1},  # no custom_id: keyed by content, sample included; a twin of b2
    ]
    second.write_text("".join(json.dumps(line) + "\n" for line in lines))
    said = CliRunner().invoke(app, ["enqueue", str(second)], env=env)
    assert said.exit_code == 0, said.output
    assert "enqueued 4 request(s), 1 answered from the cache, 1 waiting for an identical request in flight" in flat(
        said.output
    )
    third = tmp_path / "third.jsonl"
    third.write_text(json.dumps({"custom_id": "c0", "body": body}) + "\n")
    said = CliRunner().invoke(app, ["enqueue", str(third), "--no-cache"], env=env)
    assert "enqueued 1 request(s); " in flat(said.output)  # --no-cache: neither copied nor waiting
    run(settings)
    assert calls(mock) == 4  # b1, b2 and c0
    found = {r["idempotency_key"]: r for r in all_rows(settings)}
    assert found["b0"]["cached_from"] == found["a0"]["id"] and found["b1"]["cached_from"] is None
    assert found["b2"]["sample"] == 1 and found["b2"]["cache_key"] != found["a0"]["cache_key"]
    keyed = next(r for k, r in found.items() if k.startswith("sha256:"))
    assert keyed["cached_from"] == found["b2"]["id"]
    with Ledger(settings=settings) as ledger:
        assert ledger.store.spend_today() == pytest.approx(
            sum(r["cost_usd"] for r in found.values() if r["cached_from"] is None)
        )


def test_sqlite_finds_an_enqueue_s_sources_and_twins_by_index_never_by_scanning_the_ledger(sqlite_url: str) -> None:
    """Each of an enqueue's statements that look for a question's other requests (a source to
    copy, an original in flight to wait for) reaches them through an index: a statement that
    scanned the ledger made every chunk of a large enqueue read every request the ledger held."""
    settings = Settings(LEDGER_DATABASE_URL=sqlite_url, OPENAI_API_KEY="test-key")
    seen: list[tuple[str, Any]] = []
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many([question(i) for i in range(50)])  # in flight: the next ones' twins
        event.listen(ledger.store.engine, "before_cursor_execute", lambda *a: seen.append((a[2], a[3])))
        ledger.enqueue_many([question(i, idempotency_key=f"again-{i}") for i in range(50)])
        looked = [(sql, args) for sql, args in seen if "cache_key" in sql and "llm_requests AS" in sql]
        assert looked, "no statement of the enqueue looked for a question's other requests"
        with ledger.store.engine.connect() as conn:
            for sql, args in looked:
                plan = [row[3] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, args)]
                scans = [step for step in plan if re.match(r"SCAN (llm_requests|n|src|other|cand)\b", step)]
                assert not scans, (sql, plan)


def test_postgresql_finds_a_chunk_s_sources_by_question_with_statistics_from_before_the_answers(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger analysed while its requests were queued, then answered: its statistics still say
    no request has an answer time. The source of each request of a chunk is looked up by its
    question's index all the same, never through the index of answer times, which those
    statistics make look empty and which holds every answer (on a ledger of 100,000, every
    chunk read them all, one request at a time: twice the time of the enqueue). The plan is
    read from the chunk's own insert, with its rows staged; then once more with the question's
    index gone (for that statement only), which shows the lookup cannot take the other."""
    settings = Settings(LEDGER_DATABASE_URL=pg_url, OPENAI_API_KEY="test-key")
    plans: list[str] = []
    without: list[str] = []
    copy_then_insert = dialect_module.copy_then_insert

    def explained(conn: Any, table: Any, stage: str, columns: Any, rows: Any, insert: str) -> Any:
        written = copy_then_insert(conn, table, stage, columns, rows, insert)
        plans.append("\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + insert)))
        conn.exec_driver_sql("SAVEPOINT without_the_question_index")
        conn.exec_driver_sql("DROP INDEX ix_llm_requests_cache_key")
        without.append("\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + insert)))
        conn.exec_driver_sql("ROLLBACK TO SAVEPOINT without_the_question_index")
        return written

    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many([question(i) for i in range(3000)])
        with ledger.store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE llm_requests")
        with ledger.store.engine.begin() as conn:
            answered = "UPDATE llm_requests SET status = 'completed', raw_output = 'VERDICT: 3', completed_at = now()"
            conn.exec_driver_sql(answered)
        monkeypatch.setattr(dialect_module, "copy_then_insert", explained)
        again = ledger.enqueue_many([question(i, idempotency_key=f"again-{i}") for i in range(3000)])
    assert (again.inserted, again.cached) == (3000, 3000)
    assert plans
    for plan in plans:
        assert "ix_llm_requests_cache_key" in plan and "ix_llm_requests_completed" not in plan, plan
    for plan in without:
        assert "ix_llm_requests_completed" not in plan, plan
