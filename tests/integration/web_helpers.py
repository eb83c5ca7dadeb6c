"""The web view's test ledger (built once per database per module) and what reads its pages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import insert, update

from adapters.mock_provider import running_mock_provider
from ledger.enqueue import build_spec, to_row
from ledger.jobs import trigger
from ledger.models import LlmAttempt, LlmRequest
from ledger.settings import Settings, load_settings
from ledger.spec import load_spec
from ledger.store import Store
from tests.integration.batch_helpers import batch_settings, run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eval" / "spec.toml"
requests_t = LlmRequest.__table__  # type: ignore[attr-defined]
attempts_t = LlmAttempt.__table__  # type: ignore[attr-defined]

# What a hostile model (or stage) writes: markup, an event handler, a script URL.
HOSTILE_OUTPUT = (
    "<script>window.__pwned = 1; alert('x')</script>\n"
    '<img src=x onerror="window.__pwned = 2">\n'
    '<a href="javascript:window.__pwned = 3">click me</a>\n'
    "VERDICT: 3"
)
HOSTILE_KEY = "<script>window.__pwned=4</script>"
HOSTILE_AGENT = '<img src=x onerror="window.__pwned=5">'


@dataclass
class WebLedger:
    """A ledger with the example job answered, a hostile request, queued requests in two pools,
    an error, a parse error and a 429: `ids` names the interesting rows."""

    url: str
    job_id: str
    ids: dict[str, int]

    def settings(self, **overrides: Any) -> Settings:
        return load_settings(_env_file=None, LEDGER_DATABASE_URL=self.url, **overrides)


def build_ledger(url: str) -> WebLedger:
    with running_mock_provider() as mock:
        settings = batch_settings(url, mock)
        store = Store(url)
        job_id = trigger(store, settings, load_spec(EXAMPLE)).job_id
        run(settings)
    specs = [
        build_spec(
            model="m1",
            provider="mock",
            job_id=None,
            idempotency_key=f"page-{i:03d}",
            messages=[{"role": "user", "content": f"page {i}"}],
        )
        for i in range(60)
    ]
    specs += [
        build_spec(
            model="m2",
            provider="mock",
            idempotency_key=f"other-{i:03d}",
            messages=[{"role": "user", "content": f"other {i}"}],
        )
        for i in range(60)
    ]
    specs.append(
        build_spec(
            model="m2",
            provider="mock",
            idempotency_key=HOSTILE_KEY,
            messages=[{"role": "user", "content": "<b>bold?</b> javascript:alert(1)"}],
            trace={"agent": HOSTILE_AGENT, "note": "<script>window.__pwned=6</script>"},
        )
    )
    store.enqueue(to_row(spec) for spec in specs)
    ids = {
        row["idempotency_key"]: int(row["id"])
        for row in store.request_page(_everything(), limit=1000).rows
        if not str(row["idempotency_key"]).startswith(job_id)
    }
    hostile, error, unparsed, limited = ids[HOSTILE_KEY], ids["other-001"], ids["other-002"], ids["page-003"]
    with store.engine.begin() as conn:
        conn.execute(
            update(requests_t)
            .where(requests_t.c.id == hostile)
            .values(
                status="completed",
                raw_output=HOSTILE_OUTPUT,
                verdict_text="VERDICT: 3",
                parsed_verdict=3,
                thinking="<script>window.__pwned=7</script>",
                finish_reason="tool_calls",
                tool_calls=[{"id": "call_1", "name": "<b>fetch</b>", "arguments": '{"url": "javascript:alert(1)"}'}],
                refusal="<i>no</i>",
                input_tokens=10,
                output_tokens=20,
                cached_input_tokens=4,
                reasoning_tokens=5,
                cost_usd=0.001,
                attempts=1,
            )
        )
        conn.execute(
            update(requests_t)
            .where(requests_t.c.id == error)
            .values(status="error", error_code="server_error", last_status_code=503, error_message="<b>down</b>")
        )
        conn.execute(
            update(requests_t)
            .where(requests_t.c.id == unparsed)
            .values(
                status="completed", raw_output="no verdict here", parse_error="no VERDICT line", finish_reason="length"
            )
        )
        conn.execute(update(requests_t).where(requests_t.c.id == limited).values(attempts=2, last_status_code=200))
        conn.execute(
            insert(attempts_t),
            [
                {"request_id": limited, "attempt": 1, "worker": "w<1>", "outcome": "failed", "status_code": 429},
                {"request_id": limited, "attempt": 2, "worker": "w<1>", "outcome": "succeeded", "status_code": 200},
                {"request_id": hostile, "attempt": 1, "worker": "w1", "outcome": "succeeded", "status_code": 200},
            ],
        )
    store.close()
    named = {"hostile": hostile, "error": error, "unparsed": unparsed, "limited": limited}
    return WebLedger(url, job_id, {**ids, **named})


def _everything() -> Any:
    from ledger.store.browse import RequestFilter

    return RequestFilter()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def web_ledger(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebLedger]:
    """The test ledger on a real SQLite file, then on a fresh PostgreSQL schema: built once per
    module (running the example job takes seconds), read by every test of it."""
    if request.param == "sqlite":
        yield build_ledger(f"sqlite:///{tmp_path_factory.mktemp('web') / 'ledger.db'}")
        return
    server = request.getfixturevalue("pg_server")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.dsn, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            yield build_ledger(server.schema_url(schema))
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


class Page(HTMLParser):
    """A page's elements as (tag, attributes) in order, with each element's text (for the few
    elements tests read: cells, rows, links)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.texts: list[str] = []
        self._open: list[int] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        self.texts.append("")
        if tag not in ("input", "img", "meta", "link", "br", "hr"):
            self._open.append(len(self.elements) - 1)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            index = self._open.pop()
            if self.elements[index][0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for index in self._open:
            self.texts[index] += data

    def find(self, tag: str, **attrs: str) -> list[tuple[dict[str, str], str]]:
        """Elements of `tag` having these attributes (a value of "*": present), with their text."""
        found = []
        for (name, have), text in zip(self.elements, self.texts, strict=True):
            if name != tag:
                continue
            if all(key in have and (value == "*" or have[key] == value) for key, value in attrs.items()):
                found.append((have, text))
        return found

    def row_ids(self) -> list[int]:
        return [int(a["data-request-id"]) for a, _ in self.find("tr", **{"data-request-id": "*"})]

    def next_link(self) -> str | None:
        links = self.find("a", rel="next")
        return links[0][0]["href"] if links else None


LEDGER = [sys.executable, "-m", "ledger.cli"]
FIRST_LINE = re.compile(r"^ledger web: http://(\S+):(\d+)/$")


def env_for(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    return {**env, "LEDGER_DATABASE_URL": url, **extra}


@contextmanager
def web_process(url: str, *args: str, **env: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`ledger web --port 0 ARGS` as a user starts it, and the base URL its first line names
    (always reached through 127.0.0.1); stopped after."""
    proc = subprocess.Popen(
        [*LEDGER, "web", "--port", "0", *args],
        env=env_for(url, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().rstrip("\n")  # blocks until the server is bound
        found = FIRST_LINE.match(line)
        assert found, (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield proc, f"http://127.0.0.1:{found.group(2)}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
