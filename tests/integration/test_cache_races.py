"""The response cache's promise under forced races: one provider call per question however
enqueues, claims and the writes that end originals interleave. Each test holds one enqueue
between two of its statements (`ledger.store.cache.between_statements`) while the rest runs.

On SQLite the held enqueue holds the file's only write lock, so nothing else writes until it
commits: there the tests run the one order SQLite allows and check that it keeps the promise too."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from adapters.mock_provider import RunningMockProvider, running_mock_provider
from ledger.api import Ledger
from ledger.settings import Settings
from ledger.store import cache
from tests.integration.batch_helpers import batch_settings, requests_t, rows, run

QUESTIONS = 3


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider() as server:
        yield server


class HeldEnqueue:
    """An enqueue run in a thread of its own and held at `point` (one of `between_statements`'
    points) until `go`; every other enqueue passes the point."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, point: str, enqueue: Callable[[], Any]) -> None:
        self.point, self.reached, self.released = point, threading.Event(), threading.Event()
        self.failed: list[BaseException] = []
        self.backends: dict[threading.Thread, int] = {}  # each enqueue's PostgreSQL backend (its pid)
        self.thread = threading.Thread(target=self._run, args=(enqueue,))
        monkeypatch.setattr(cache, "between_statements", self._at)
        self.thread.start()
        assert self.reached.wait(timeout=30), f"the enqueue never reached {point!r}"

    def _run(self, enqueue: Callable[[], Any]) -> None:
        try:
            enqueue()
        except BaseException as exc:  # the test's thread says so
            self.failed.append(exc)
            self.reached.set()

    def _at(self, point: str, conn: Connection) -> None:
        if point == "inserted" and conn.dialect.name == "postgresql":
            self.backends[threading.current_thread()] = conn.connection.driver_connection.info.backend_pid
        if point == self.point and threading.current_thread() is self.thread and not self.released.is_set():
            self.reached.set()
            assert self.released.wait(timeout=30), "the test never let the held enqueue go"

    def go(self) -> None:
        self.released.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive() and not self.failed, self.failed


def question(i: int, key: str, marker: str = "") -> dict[str, Any]:
    content = f"Rate answer {i}. End with VERDICT: <1-5>.{marker}"
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], "idempotency_key": key}


def each_question_twice(who: str) -> list[dict[str, Any]]:
    """Every question twice in one call, under keys of their own: the second a twin of the first."""
    return [question(i, f"{who}:{i}:{copy}") for i in range(QUESTIONS) for copy in range(2)]


def enqueue(settings: Settings, specs: list[dict[str, Any]]) -> None:
    with Ledger(settings=settings) as ledger:
        ledger.enqueue_many(specs)


def calls(mock: RunningMockProvider) -> int:
    return int(mock.server.stats()["calls"])


def ledger_rows(settings: Settings) -> list[dict[str, Any]]:
    with Ledger(settings=settings) as ledger:
        return rows(ledger.store, requests_t)


def test_an_enqueue_that_wrote_first_but_resolved_second_makes_no_second_original(
    db_url: str, mock: RunningMockProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two enqueues of the same questions, each question twice: the first writes its rows (the
    lower ids) and is held before the cache's lock; the second writes, resolves and commits.
    The first's requests must all wait for the second's originals, not for its own first copy
    of each question (a twin that waits for a twin is released as an original once its
    original is answered from the cache: a second call)."""
    settings = batch_settings(db_url, mock, LEDGER_LEASE_SECONDS=2)
    held = HeldEnqueue(monkeypatch, "inserted", lambda: enqueue(settings, each_question_twice("early")))
    if db_url.startswith("postgresql"):
        enqueue(settings, each_question_twice("late"))
        held.go()
    else:  # the held enqueue holds the write lock: the other can only follow it
        held.go()
        enqueue(settings, each_question_twice("late"))
    run(settings)
    assert calls(mock) == QUESTIONS
    found = ledger_rows(settings)
    assert len(found) == 4 * QUESTIONS and all(r["status"] == "completed" for r in found)
    assert sum(1 for r in found if r["cached_from"] is None) == QUESTIONS


def test_a_twin_of_an_original_that_failed_while_it_was_enqueued_waits_for_the_one_called_next(
    db_url: str, mock: RunningMockProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An original and its twin; a third identical request's enqueue reads the original in flight
    and is held there while the original fails (its twin becomes the original and is answered),
    then commits waiting for the failed one, unseen by the write that ended it. It must be
    answered from the twin that was called, not called a third time."""
    settings = batch_settings(db_url, mock, LEDGER_LEASE_SECONDS=2, RETRY_MAX_ATTEMPTS=1)
    failing_once = [question(0, f"first:{copy}", " [[mock:fail=400x1]]") for copy in range(2)]
    enqueue(settings, failing_once)
    late = [question(0, "late:0", " [[mock:fail=400x1]]")]
    held = HeldEnqueue(monkeypatch, "read", lambda: enqueue(settings, late))
    if db_url.startswith("postgresql"):
        run(settings)  # the original fails, its twin is called and answered
        assert calls(mock) == 2
        held.go()
    else:  # the held enqueue holds the write lock: the daemon can only follow it
        held.go()
    run(settings)
    assert calls(mock) == 2
    found = {r["idempotency_key"]: r for r in ledger_rows(settings)}
    answered = found["first:1"]
    assert found["first:0"]["status"] == "error" and answered["status"] == "completed"
    assert (found["late:0"]["status"], found["late:0"]["cached_from"]) == ("completed", answered["id"])


def test_a_question_asked_while_a_twin_waits_for_its_canceled_original_waits_for_that_twin(
    db_url: str, mock: RunningMockProvider
) -> None:
    """A twin's original is canceled (a cancel settles no twin: the claim's sweep releases it as
    the original). The same question enqueued before that sweep must wait for the released twin,
    not become an original of its own and be called beside it."""
    settings = batch_settings(db_url, mock, LEDGER_LEASE_SECONDS=2)
    with Ledger(settings=settings) as ledger:
        first = ledger.enqueue_many([question(0, f"first:{copy}") for copy in range(2)])
        ledger.store.cancel(ids=[first.inserted_rows[0]["id"]])
        again = ledger.enqueue_many([question(0, "again")])
    run(settings)
    assert calls(mock) == 1 and again.twins == 1
    found = {r["idempotency_key"]: r for r in ledger_rows(settings)}
    released = found["first:1"]
    assert found["first:0"]["status"] == "canceled" and released["status"] == "completed"
    assert (found["again"]["status"], found["again"]["cached_from"]) == ("completed", released["id"])


def until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Poll `condition` until it holds (a deadline, not a sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def waits_for_a_lock(settings: Settings, backend: int) -> bool:
    """Whether the PostgreSQL backend `backend` waits for a lock (a question's row, held by the
    enqueue of the same question that took its turn first)."""
    query = text("SELECT count(*) FROM pg_locks WHERE pid = :pid AND NOT granted")
    with Ledger(settings=settings) as ledger, ledger.store.engine.connect() as conn:
        return bool(conn.execute(query, {"pid": backend}).scalar_one())


def test_an_enqueue_that_waited_for_the_caches_lock_sees_what_its_holder_committed(
    db_url: str, mock: RunningMockProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One enqueue holds its questions' turns (held after reading its questions' rows); another
    writes the same questions and waits for their turn. Once the first commits, the second's read
    must see its originals: read in a statement of its own after the turn was granted, never in
    the one that waited (PostgreSQL's READ COMMITTED takes a statement's snapshot when it starts)."""
    settings = batch_settings(db_url, mock, LEDGER_LEASE_SECONDS=2)
    holder = HeldEnqueue(monkeypatch, "read", lambda: enqueue(settings, each_question_twice("holder")))
    if db_url.startswith("postgresql"):
        waiter = threading.Thread(target=enqueue, args=(settings, each_question_twice("waiter")))
        waiter.start()
        until(lambda: waiter in holder.backends, "the other enqueue wrote its rows")  # next, the lock
        until(lambda: waits_for_a_lock(settings, holder.backends[waiter]), "it waited for the questions' turn")
        holder.go()
        waiter.join(timeout=30)
        assert not waiter.is_alive()
    else:  # the held enqueue holds the write lock: the other can only follow it
        holder.go()
        enqueue(settings, each_question_twice("waiter"))
    run(settings)
    assert calls(mock) == QUESTIONS
    found = ledger_rows(settings)
    assert len(found) == 4 * QUESTIONS and sum(1 for r in found if r["cached_from"] is None) == QUESTIONS


def test_enqueues_of_different_questions_do_not_wait_for_each_other(
    pg_url: str, mock: RunningMockProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL an enqueue held while it holds its questions' turns (after reading their
    rows, before committing) stops no enqueue of other questions: that one commits meanwhile. An
    enqueue of one of the held questions still waits for it, and the promise holds: one call per
    question. SQLite has one writer at a time whatever the questions: nothing to show there."""
    settings = batch_settings(pg_url, mock, LEDGER_LEASE_SECONDS=2)
    holder = HeldEnqueue(monkeypatch, "read", lambda: enqueue(settings, [question(0, "held:0")]))
    other = [question(i, f"other:{i}") for i in range(1, QUESTIONS)]
    others = threading.Thread(target=enqueue, args=(settings, other))
    others.start()
    others.join(timeout=20)  # the holder stays held meanwhile
    assert not others.is_alive(), "an enqueue of other questions waited for the held one"
    assert {r["idempotency_key"] for r in ledger_rows(settings)} == {"other:1", "other:2"}
    same = threading.Thread(target=enqueue, args=(settings, [question(0, "same:0")]))
    same.start()
    until(lambda: same in holder.backends, "the enqueue of the held question wrote its row")
    until(lambda: waits_for_a_lock(settings, holder.backends[same]), "it waited for the question's turn")
    holder.go()
    same.join(timeout=30)
    assert not same.is_alive()
    run(settings)
    assert calls(mock) == QUESTIONS
    found = {r["idempotency_key"]: r for r in ledger_rows(settings)}
    assert found["same:0"]["cached_from"] == found["held:0"]["id"]
