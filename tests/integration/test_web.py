"""The web view through Starlette's TestClient, on SQLite and PostgreSQL: every page and fragment,
the filters, keyset pages, exports, escaping of hostile output, the token, the Host check, and
actions refused unless allowed (with their CSRF token when allowed)."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import update
from starlette.testclient import TestClient
from typer.testing import CliRunner

from ledger.cli import app as cli
from ledger.enqueue import build_spec, to_row
from ledger.settings import load_settings
from ledger.store import Store
from ledger.store import browse as browse_module
from ledger.web import WebConfig, create_app
from tests.integration.web_helpers import HOSTILE_AGENT, HOSTILE_KEY, Page, WebLedger, web_ledger

__all__ = ["web_ledger"]  # the module-scoped fixture, built once per database

HOSTS = frozenset({"testserver"})
MSG = [{"role": "user", "content": "x"}]


@pytest.fixture
def store(web_ledger: WebLedger) -> Iterator[Store]:
    opened = Store(web_ledger.url)
    yield opened
    opened.close()


def client_for(ledger: WebLedger, store: Store, **config: Any) -> TestClient:
    settings = ledger.settings()
    return TestClient(create_app(store, settings, WebConfig(hosts=HOSTS, **config)))


@pytest.fixture
def client(web_ledger: WebLedger, store: Store) -> Iterator[TestClient]:
    with client_for(web_ledger, store) as opened:
        yield opened


def all_ids(store: Store) -> list[int]:
    return sorted((r["id"] for r in store.list_requests(limit=10_000)), reverse=True)


def test_every_page_and_fragment_answers_with_its_content(web_ledger: WebLedger, client: TestClient) -> None:
    job, ids = web_ledger.job_id, web_ledger.ids
    pages = {
        "/": ["Requests by status", 'id="pools"', "mock:m1", "Oldest queued request"],
        "/?fragment=overview": ['id="status-counts"'],
        "/jobs": [f'data-job="{job}"'],
        "/jobs?fragment=jobs": ['id="jobs"'],
        f"/jobs/{job}": ['id="score-matrix"', 'id="job-progress" data-done="30" data-total="30"'],
        f"/jobs/{job}?fragment=job_summary": ['id="job-facts"'],
        f"/jobs/{job}?fragment=job_matrix": ['id="score-matrix"'],
        f"/jobs/{job}/cell?agent=defense&dimension=correctness": ['id="cell-opinions"', 'class="request-link"'],
        f"/jobs/{job}/compare/{job}": ['id="compare"', 'data-change="0"'],
        "/requests": ['id="requests"', 'rel="next"', "export.jsonl"],
        "/requests?fragment=request_rows": ['id="requests"'],
        f"/requests/{ids['limited']}": ['id="attempts"', 'data-attempt="1"', 'data-attempt="2"'],
        f"/requests/{ids['limited']}?fragment=attempts": ['data-attempt="2"'],
        "/batches": ['id="batches"'],
        "/batches?fragment=batches": ['id="batches"'],
        "/spend": ['id="spend-by-model"', 'id="pool-trouble"', "gpt-4o-mini"],
        "/spend?unit=day": ['id="spend-by-job_id"'],
        "/spend?fragment=spend": ['id="spend-total"'],
    }
    for path, expected in pages.items():
        response = client.get(path)
        assert response.status_code == 200, path
        for text in expected:
            assert text in response.text, (path, text)
    assert client.get("/requests/999999").status_code == 404
    assert client.get("/jobs/no-such-job").status_code == 404
    assert client.get("/jobs?fragment=no_such").status_code == 404
    assert client.get("/static/ledger.js").status_code == 200


def test_the_matrix_equals_report_json(web_ledger: WebLedger, client: TestClient) -> None:
    said = CliRunner().invoke(cli, ["report", web_ledger.job_id, "--json"], env={"LEDGER_DATABASE_URL": web_ledger.url})
    assert said.exit_code == 0, said.output
    opinions = [json.loads(line) for line in said.output.splitlines() if line.strip()]
    expected = {(o["agent"], o["dimension"]): "" if o["score"] is None else str(o["score"]) for o in opinions}
    page = Page(client.get(f"/jobs/{web_ledger.job_id}").text)
    cells = page.find("td", **{"data-agent": "*", "data-dimension": "*"})
    shown = {(a["data-agent"], a["data-dimension"]): a["data-score"] for a, _ in cells}
    assert len(shown) == 30 and shown == expected
    # Rows where judges differ by 2 or more are marked, and only those.
    for row, _ in page.find("tr", **{"data-dimension": "*"}):
        scores = [int(s) for (a, d), s in expected.items() if d == row["data-dimension"] and s]
        assert ("disagree" in row.get("class", "")) == (max(scores) - min(scores) >= 2)


def test_a_cell_leads_to_its_request_and_attempts(web_ledger: WebLedger, client: TestClient) -> None:
    page = Page(client.get(f"/jobs/{web_ledger.job_id}").text)
    cell = page.find("td", **{"data-agent": "prosecutor", "data-dimension": "clarity"})[0]
    link = re.search(
        r'href="([^"]+)"',
        client.get(f"/jobs/{web_ledger.job_id}").text.split('data-agent="prosecutor" data-dimension="clarity"')[1],
    )
    assert cell and link
    opened = Page(client.get(link.group(1).replace("&amp;", "&")).text)
    (row, _), *_ = opened.find("tr", **{"data-request-id": "*"})
    request = Page(client.get(f"/requests/{row['data-request-id']}").text)
    assert request.find("table", id="attempts") and request.find("tr", **{"data-attempt": "1"})
    assert request.find("mark", id="verdict-line")


def test_filters_select_what_they_name(web_ledger: WebLedger, client: TestClient, store: Store) -> None:
    ids = web_ledger.ids

    def shown(query: str) -> list[int]:
        return Page(client.get(f"/requests?{query}").text).row_ids()

    assert shown("status=error") == [ids["error"]]
    assert ids["hostile"] in shown("status=completed") and ids["error"] not in shown("status=completed")
    assert shown("had_429=1") == [ids["limited"]]
    assert shown("parse_error=1") == [ids["unparsed"]]
    assert shown("finish_reason=length") == [ids["unparsed"]]
    assert shown("q=page-00") == sorted((ids[f"page-00{i}"] for i in range(10)), reverse=True)
    assert shown("q=%3Cscript") == [ids["hostile"]]
    whole = Page(client.get("/requests?q=page-007").text).find("p", id="exact-match")
    assert whole and f"#{ids['page-007']}" in whole[0][1]
    job_rows = shown(f"job={web_ledger.job_id}")
    assert len(job_rows) == 30 and job_rows == sorted(job_rows, reverse=True)
    assert set(shown("model=m1&pool=mock:m1")) <= {ids[f"page-{i:03d}"] for i in range(60)}
    assert shown("provider=mock&model=m1&delivery=batch") == []
    assert shown("provider=openai&status=error") == []
    assert len(shown("delivery=online")) == 50  # a full page
    assert shown(f"job={web_ledger.job_id}&had_429=1") == []


def test_keyset_pages_walk_every_request_once(client: TestClient, store: Store) -> None:
    seen: list[int] = []
    path: str | None = "/requests"
    while path is not None:
        page = Page(client.get(path).text)
        seen += page.row_ids()
        path = page.next_link()
    assert seen == all_ids(store)


def test_a_page_that_runs_out_of_its_scan_budget_goes_on_from_there(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch, web_ledger: WebLedger
) -> None:
    monkeypatch.setattr(browse_module, "SCAN_ROWS", 20)
    monkeypatch.setattr(browse_module, "FIRST_SLICE", 10)
    seen: list[int] = []
    pages = 0
    path: str | None = "/requests?model=m2"
    while path is not None:
        text = client.get(path).text
        pages += 1
        seen += Page(text).row_ids()
        path = Page(text).next_link()
        path = None if path is None else path.replace("&amp;", "&")
    expected = [r["id"] for r in store.list_requests(limit=10_000) if r["model"] == "m2"]
    assert seen == sorted(expected, reverse=True) and pages > 3


def test_exports_stream_the_filtered_set(web_ledger: WebLedger, client: TestClient, store: Store) -> None:
    lines = client.get("/requests/export.jsonl?model=m1").text.splitlines()
    rows = [json.loads(line) for line in lines]
    expected = sorted((r["id"] for r in store.list_requests(limit=10_000) if r["model"] == "m1"), reverse=True)
    assert [r["id"] for r in rows] == expected and all(r["model"] == "m1" for r in rows)
    table = list(csv.DictReader(io.StringIO(client.get("/requests/export.csv?status=error").text)))
    assert [int(r["id"]) for r in table] == [web_ledger.ids["error"]] and table[0]["error_code"] == "server_error"
    everything = client.get("/requests/export.jsonl").text.splitlines()
    assert len(everything) == len(all_ids(store))


def test_hostile_output_is_text_everywhere(web_ledger: WebLedger, client: TestClient) -> None:
    hostile = web_ledger.ids["hostile"]
    pages = [f"/requests/{hostile}", "/requests", "/requests?q=%3Cscript", "/requests/export.csv"]
    for path in pages[:3]:
        html = client.get(path).text
        assert "<script>window" not in html and "<img src=x" not in html, path
        assert 'href="javascript:' not in html.lower() and 'onerror="window' not in html, path
    page = client.get(f"/requests/{hostile}").text
    assert "&lt;script&gt;window.__pwned = 1" in page
    assert "&lt;img src=x onerror=&#34;window.__pwned = 2&#34;&gt;" in page
    assert "&lt;a href=&#34;javascript:window.__pwned = 3&#34;&gt;" in page
    assert HOSTILE_KEY not in page and "&lt;script&gt;window.__pwned=4&lt;/script&gt;" in page
    assert "&lt;b&gt;fetch&lt;/b&gt;" in page  # a tool call's name
    assert "&lt;script&gt;window.__pwned=7" in page  # thinking
    assert HOSTILE_AGENT not in page  # trace values
    # Every script a page loads is our own file; none is inline.
    for path in ("/", f"/requests/{hostile}", f"/jobs/{web_ledger.job_id}"):
        scripts = Page(client.get(path).text).find("script")
        assert [a.get("src") for a, _ in scripts] == ["/static/ledger.js"]
        assert all(not text.strip() for _, text in scripts)


def test_security_headers(client: TestClient) -> None:
    response = client.get("/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"


def test_a_foreign_host_header_is_refused(client: TestClient) -> None:
    assert client.get("/", headers={"host": "evil.example:8765"}).status_code == 421


def test_with_a_token_every_request_needs_it(web_ledger: WebLedger, store: Store) -> None:
    with client_for(web_ledger, store, token="s3cret-token") as client:
        refused = client.get("/jobs", follow_redirects=False)
        assert refused.status_code == 401 and 'id="login"' in refused.text and "s3cret" not in refused.text
        assert client.get("/events").status_code == 401
        assert client.get("/requests/export.jsonl").status_code == 401
        assert client.get("/static/ledger.css").status_code == 200
        assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/jobs", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        wrong = client.post("/login", data={"token": "nope", "next": "/jobs"}, follow_redirects=False)
        assert wrong.status_code == 401
        signed = client.post("/login", data={"token": "s3cret-token", "next": "/jobs"}, follow_redirects=False)
        assert signed.status_code == 303 and signed.headers["location"] == "/jobs"
        assert "s3cret-token" not in signed.headers["set-cookie"] and "httponly" in signed.headers["set-cookie"].lower()
        assert client.get("/jobs").status_code == 200  # the cookie now
        away = client.post("/login", data={"token": "s3cret-token", "next": "//evil.example/"}, follow_redirects=False)
        assert away.headers["location"] == "/"


def test_actions_are_refused_without_allow_actions(web_ledger: WebLedger, client: TestClient) -> None:
    for path in (f"/jobs/{web_ledger.job_id}/cancel", "/batches/1/cancel", "/pools/mock:m1/resume"):
        assert client.post(path, data={"csrf": "x"}).status_code == 403
        assert client.get(path).status_code == 405
    for path in ("/", f"/jobs/{web_ledger.job_id}", "/batches"):
        assert 'method="post"' not in client.get(path).text


def test_an_allowed_action_needs_its_csrf_token(web_ledger: WebLedger, store: Store) -> None:
    from ledger.enqueue import build_spec, to_row
    from ledger.store.jobs import jobs

    with store.engine.begin() as conn:
        conn.execute(jobs.insert().values(id="to-cancel", kind="adhoc", status="running", phase="running"))
    store.enqueue(
        [
            to_row(
                build_spec(
                    model="m3",
                    provider="mock",
                    job_id="to-cancel",
                    idempotency_key="tc-1",
                    messages=[{"role": "user", "content": "x"}],
                )
            )
        ]
    )
    with client_for(web_ledger, store, allow_actions=True) as client:
        page = client.get("/jobs/to-cancel").text
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert token and 'id="cancel-job"' in page
        assert client.post("/jobs/to-cancel/cancel", data={}).status_code == 403
        assert client.post("/jobs/to-cancel/cancel", data={"csrf": "0" * 64}).status_code == 403
        crossed = client.post(
            "/jobs/to-cancel/cancel", data={"csrf": token.group(1)}, headers={"origin": "http://evil.example"}
        )
        assert crossed.status_code == 403
        assert store.get_job("to-cancel")["status"] == "running"  # type: ignore[index]
        done = client.post("/jobs/to-cancel/cancel", data={"csrf": token.group(1)}, follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == "/jobs/to-cancel"
    assert store.get_job("to-cancel")["status"] == "canceled"  # type: ignore[index]
    assert store.status_counts("to-cancel")["canceled"] == 1


def test_change_marks_move_when_the_ledger_does(web_ledger: WebLedger, store: Store) -> None:
    from ledger.enqueue import build_spec, to_row

    before = store.change_marks()
    assert store.change_marks() == before  # nothing moved: the same marks
    store.enqueue(
        [
            to_row(
                build_spec(
                    model="m4", provider="mock", idempotency_key="mark-1", messages=[{"role": "user", "content": "x"}]
                )
            )
        ]
    )
    after = store.change_marks()
    assert after["requests"] != before["requests"]
    store.cancel(ids=[web_ledger.ids["page-010"]])
    assert store.change_marks()["completed"] != after["completed"]


def test_the_job_summary_counts_as_job_progress_does(web_ledger: WebLedger, store: Store) -> None:
    summary = store.job_summary([web_ledger.job_id, "no-such-job"])
    progress = store.job_progress(web_ledger.job_id)
    for key in ("total", "done", "open", "running", "truncated"):
        assert summary[web_ledger.job_id][key] == progress[key], key
    assert summary[web_ledger.job_id]["spent_usd"] == pytest.approx(progress["spent_usd"])
    assert summary["no-such-job"]["total"] == 0 and summary["no-such-job"]["errors"] == []


def test_the_overview_counts_requests_by_pool_and_status(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = store.ledger_counts().requests  # (pool, status) -> requests, counted whole
    page = Page(client.get("/").text)
    for (pool, status), n in exact.items():
        assert page.find("tr", **{"data-pool": pool})
        assert store.requests_by_pool()[pool][status].n == n
    shown = {a["data-status"]: text for a, text in page.find("td", **{"data-status": "*"})}
    for status in ("queued", "completed"):
        assert shown[status].strip() == f"{sum(n for (_, s), n in exact.items() if s == status):,}"
    monkeypatch.setattr(browse_module, "COUNT_CAP", 5)
    capped = Page(client.get("/").text)
    queued = {a["data-status"]: text for a, text in capped.find("td", **{"data-status": "*"})}["queued"]
    assert queued.strip().endswith("+")


def test_a_finished_status_is_counted_up_to_its_own_cap_and_the_waiting_ones_stay_exact(
    client: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    exact = store.ledger_counts().requests
    monkeypatch.setattr(browse_module, "FINAL_COUNT_CAP", 1)
    by_pool = store.requests_by_pool()
    for (pool, status), n in exact.items():
        finished = status in ("completed", "error", "canceled")
        expected = browse_module.Count(min(n, 1), capped=n > 1) if finished else browse_module.Count(n)
        assert by_pool[pool][status] == expected, (pool, status)
    shown = {
        a["data-status"]: text.strip() for a, text in Page(client.get("/").text).find("td", **{"data-status": "*"})
    }
    assert shown["completed"].endswith("+")
    assert shown["queued"] == f"{sum(n for (_, s), n in exact.items() if s == 'queued'):,}"


def test_the_overview_counts_each_pools_calls_and_tokens_in_the_rate_window(db_url: str) -> None:
    """Calls started in the last minute (the newest attempts) and tokens of answers that came in it,
    per pool; older ones are not in the window."""
    from datetime import timedelta

    from sqlalchemy import insert

    from ledger.models import LlmAttempt
    from ledger.store.tables import requests

    store = Store(db_url)
    try:
        store.enqueue(
            [
                to_row(build_spec(model=m, provider="mock", idempotency_key=f"w-{m}-{i}", messages=MSG))
                for m in ("m1", "m2")
                for i in range(3)
            ]
        )
        rows = {r["idempotency_key"]: r for r in store.request_page(browse_module.RequestFilter()).rows}
        now = store.db_clock()
        recent, old = now - timedelta(seconds=5), now - timedelta(seconds=300)
        started = {"w-m1-0": recent, "w-m1-1": recent, "w-m1-2": old, "w-m2-0": old}
        with store.engine.begin() as conn:
            conn.execute(
                insert(LlmAttempt.__table__),  # type: ignore[attr-defined]
                [
                    {
                        "request_id": rows[key]["id"],
                        "attempt": 1,
                        "worker": "w",
                        "outcome": "succeeded",
                        "started_at": at,
                    }
                    for key, at in started.items()
                ],
            )
            for key, at, tokens in (("w-m1-0", recent, 7), ("w-m2-0", old, 100)):
                conn.execute(
                    update(requests)
                    .where(requests.c.id == rows[key]["id"])
                    .values(status="completed", completed_at=at, input_tokens=tokens, output_tokens=1)
                )
        views = {v.endpoint: v for v in store.pool_views()}
        m1, m2 = rows["w-m1-0"]["endpoint"], rows["w-m2-0"]["endpoint"]
        assert (views[m1].window_calls, views[m1].window_tokens) == (2, 8)
        assert (views[m2].window_calls, views[m2].window_tokens) == (0, 0)
    finally:
        store.close()


def test_secret_looking_keys_are_hidden_and_token_counts_are_not() -> None:
    from ledger.web.formats import pretty

    shown = pretty(
        {"max_tokens": 5, "extra_headers": {"Authorization": "Bearer sk-1", "x-api-key": "sk-2"}, "api_key": "sk-3"}
    )
    assert '"max_tokens": 5' in shown and "sk-" not in shown and shown.count("[hidden]") == 3


def test_a_job_page_groups_its_errors_by_kind(web_ledger: WebLedger, store: Store, client: TestClient) -> None:
    from sqlalchemy import update

    from ledger.enqueue import build_spec, to_row
    from ledger.store.jobs import jobs
    from tests.integration.web_helpers import requests_t

    with store.engine.begin() as conn:
        conn.execute(jobs.insert().values(id="with-errors", kind="adhoc", status="completed", phase="done"))
    store.enqueue(
        to_row(build_spec(model="m5", provider="mock", job_id="with-errors", idempotency_key=f"we-{i}", messages=MSG))
        for i in range(4)
    )
    with store.engine.begin() as conn:
        for i, code in enumerate(["server_error", "server_error", "timeout"]):
            conn.execute(
                update(requests_t)
                .where(requests_t.c.idempotency_key == f"we-{i}")
                .values(status="error", error_code=code, last_status_code=503 if code == "server_error" else None)
            )
    summary = store.job_summary(["with-errors"], errors=True)["with-errors"]
    assert [(e["error_code"], e["n"]) for e in summary["errors"]] == [("server_error", 2), ("timeout", 1)]
    assert (summary["total"], summary["done"], summary["open"]) == (4, 3, 1)
    table = Page(client.get("/jobs/with-errors").text).find("table", id="job-errors")
    assert table and "server_error" in table[0][1]


def test_a_job_larger_than_a_summary_reads_says_so(
    web_ledger: WebLedger, store: Store, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browse_module, "JOB_ROWS", 10)
    summary = store.job_summary([web_ledger.job_id], errors=True)[web_ledger.job_id]
    assert summary["capped"] and summary["total"] == 10 and summary["done"] == 10
    page = Page(client.get(f"/jobs/{web_ledger.job_id}").text)
    assert page.find("span", id="job-capped")


def spend_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ledger-web-spend"]


def test_the_spend_thread_stops_with_the_app(
    web_ledger: WebLedger, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An hour's sum that takes half a second is under way when the app stops: the app waits for
    it, and no thread is left summing (one that was went on to read a closed store, and once a
    dropped schema)."""
    summing = threading.Event()
    real = store.spend_between

    def slow_hour(start: Any, end: Any) -> Any:
        summing.set()
        threading.Event().wait(0.5)  # a slow hour's sum, not a synchronisation
        return real(start, end)

    monkeypatch.setattr(store, "spend_between", slow_hour)
    with client_for(web_ledger, store):
        assert summing.wait(30)
    assert spend_threads() == []


class Kept(logging.Handler):
    """The records of one logger, whatever handlers an earlier test gave the ledger's loggers
    (the ledger's own logging does not propagate to the root, where caplog listens)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_schema_dropped_under_the_app_costs_a_warning_not_a_crashed_thread(
    pg_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    kept, web_log = Kept(), logging.getLogger("ledger.web")
    web_log.addHandler(kept)
    monkeypatch.setattr(web_log, "level", logging.WARNING)
    monkeypatch.setattr(web_log, "disabled", False)
    monkeypatch.setattr(logging.root.manager, "disable", logging.NOTSET)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.dsn, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        url = pg_server.schema_url(schema)
        store = Store(url)
        settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=url)
        try:
            with TestClient(create_app(store, settings, WebConfig(hosts=HOSTS))):
                admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
                deadline = time.monotonic() + 60
                while not crashed and not kept.records:
                    assert time.monotonic() < deadline, "the spend thread neither warned nor crashed"
                    time.sleep(0.05)
        finally:
            web_log.removeHandler(kept)
        store.close()
    assert crashed == [] and spend_threads() == []
    (warning,) = kept.records
    assert warning.levelno == logging.WARNING and "spend not summed" in warning.getMessage()
    assert len(warning.getMessage().splitlines()) == 1


def progress_cells(html: str) -> dict[str, str]:
    """/jobs: each job's progress cell, as text."""
    rows = re.findall(r'<tr data-job="([^"]+)">(.*?)</tr>', html, re.S)
    cells = {job: re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for job, row in rows}
    return {job: re.sub(r"<[^>]+>", "", found[4]).strip() for job, found in cells.items()}


def test_the_jobs_list_shows_an_ended_jobs_progress(web_ledger: WebLedger, client: TestClient) -> None:
    html = client.get("/jobs").text
    assert progress_cells(html)[web_ledger.job_id] == "30 / 30"
    assert '<progress max="30" value="30"></progress> 30 / 30' in html


def test_ended_jobs_are_summed_within_a_views_budget_and_kept(
    web_ledger: WebLedger, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.store.jobs import jobs
    from ledger.web import pages_jobs
    from tests.integration.web_helpers import requests_t

    for name in ("ended-a", "ended-b"):
        with store.engine.begin() as conn:
            conn.execute(jobs.insert().values(id=name, kind="eval", status="completed", phase="completed"))
        store.enqueue(
            to_row(build_spec(model="m6", provider="mock", job_id=name, idempotency_key=f"{name}-{i}", messages=MSG))
            for i in range(3)
        )
        with store.engine.begin() as conn:
            conn.execute(update(requests_t).where(requests_t.c.job_id == name).values(status="completed"))
    monkeypatch.setattr(pages_jobs, "JOB_ROWS", 1)  # one ended job summed per view
    with client_for(web_ledger, store) as client:
        views = [progress_cells(client.get("/jobs").text) for _ in range(6)]
    assert "see its page" in views[0].values()
    last = views[-1]
    assert (last["ended-a"], last["ended-b"], last[web_ledger.job_id]) == ("3 / 3", "3 / 3", "30 / 30")


def table_of(html: str, table_id: str) -> tuple[list[str], list[int]]:
    """A table's header texts and how many cells each of its other rows has."""
    table = re.search(rf'<table id="{table_id}".*?</table>', html, re.S)
    assert table, table_id
    header, *rows = re.findall(r"<tr\b.*?</tr>", table.group(0), re.S)
    labels = [re.sub(r"<[^>]+>", "", th).strip() for th in re.findall(r"<th\b[^>]*>(.*?)</th>", header, re.S)]
    return labels, [len(re.findall(r"<t[dh]\b", row)) for row in rows]


def test_every_column_of_the_pools_and_batches_tables_has_a_label(web_ledger: WebLedger, store: Store) -> None:
    from tests.integration.batch_helpers import batches_t

    with store.engine.begin() as conn:
        conn.execute(batches_t.insert().values(provider="openai", model="m7", status="submitted", request_total=2))
    for allow_actions, action in ((False, []), (True, ["action"])):
        with client_for(web_ledger, store, allow_actions=allow_actions) as client:
            for path, table_id in (("/", "pools"), ("/batches", "batches")):
                labels, cells = table_of(client.get(path).text, table_id)
                assert all(labels), (path, labels)
                assert [x for x in labels if x == "action"] == action, (path, labels)
                assert cells and set(cells) == {len(labels)}, (path, labels, cells)


def test_the_spend_tables_name_their_columns_in_words(client: TestClient) -> None:
    for unit in ("hour", "day"):
        html = client.get(f"/spend?unit={unit}").text
        for by, key in (("model", "model"), ("job_id", "job"), ("provider", "provider")):
            table_id = f"spend-by-{by}"
            labels, _ = table_of(html, table_id)
            assert labels[:2] == [unit, key] and "job_id" not in labels and all(labels), (table_id, labels)


@pytest.mark.parametrize(
    ("query", "named", "takes"),
    [
        ("status=bogus", "status='bogus'", "queued, running, submitted, completed, error, canceled"),
        ("finish_reason=done", "finish_reason='done'", "stop, length, tool_calls"),
        ("provider=openia", "provider='openia'", "anthropic, azure, gemini, mock, openai"),
        ("delivery=fast", "delivery='fast'", "online, batch"),
        ("batch=seven", "batch='seven'", "a whole number"),
    ],
)
def test_a_filter_value_outside_its_list_is_refused_in_one_line(
    client: TestClient, query: str, named: str, takes: str
) -> None:
    """Answered 200 with "no request matches", a typo looked like an empty ledger."""
    for path in ("/requests", "/requests/export.jsonl", "/requests/export.csv"):
        refused = client.get(f"{path}?{query}&model=m1")
        assert refused.status_code == 400, (path, refused.status_code)
        assert refused.headers["content-type"].startswith("text/plain")
        assert len(refused.text.strip().splitlines()) == 1 and named in refused.text and takes in refused.text
    assert client.get("/requests?status=&provider=&delivery=&finish_reason=&batch=").status_code == 200


def test_a_spend_unit_outside_hour_and_day_is_refused(client: TestClient) -> None:
    refused = client.get("/spend?unit=week")
    assert refused.status_code == 400 and refused.text == "unit='week' is not a spend unit: hour or day"
