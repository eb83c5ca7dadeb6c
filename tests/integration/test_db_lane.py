"""The database lane on PostgreSQL: which failures it tries again, and which it must not.

Connections are cut for real (`pg_terminate_backend` on the lane's own backend) at a
chosen moment: while a statement runs, or while the COMMIT is under way.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import openai
import psycopg
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from adapters.mock_provider import running_mock_provider
from ledger.cancel import cancel_batches
from ledger.record import DbLane
from ledger.store import Store
from ledger.store.batches import BatchGroup, BatchLease
from ledger.store.errors import DatabaseUnavailable
from ledger.store.queue import CancelResult
from ledger.store.rows import Completed, Outcome, Written
from ledger.store.schema import one_line
from tests.integration.batch_helpers import batch_settings, batches_t, rows
from tests.integration.store_helpers import add_requests, daemon_store, kept_records

T = TypeVar("T")


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    with daemon_store(pg_url, queued=2) as s:
        yield s


class _BackendCutter:
    """Terminates one backend of the store's, once, at the first moment offered after `skip`."""

    def __init__(self, admin_dsn: str, skip: int) -> None:
        self.cuts: list[int] = []  # the backend pid cut, once it happened
        self._offered = 0
        self._skip = skip
        self._admin = psycopg.connect(admin_dsn, autocommit=True)

    def due(self) -> bool:
        self._offered += 1
        return not self.cuts and self._offered > self._skip

    def cut(self, dbapi_connection: Any) -> None:
        self.cuts.append(dbapi_connection.info.backend_pid)
        self._admin.execute("SELECT pg_terminate_backend(%s)", (self.cuts[0],))
        self._admin.close()


def cut_connection_once(
    store: Store, moment: str, admin_dsn: str, *, skip: int = 0, statement_starting: str = ""
) -> list[int]:
    """Terminate the backend of the next transaction at `moment` ("begin", "statement" or "commit"),
    the `skip` such moments before it left alone (and, for a statement, only one that starts with
    `statement_starting`); returns a list that records each cut."""
    cutter = _BackendCutter(admin_dsn, skip)

    def cut(dbapi_connection: Any) -> None:
        if cutter.due():
            cutter.cut(dbapi_connection)

    if moment == "begin":  # before the transaction's first statement goes out

        @event.listens_for(store.engine, "begin")
        def _before_first(conn: Any) -> None:
            cut(conn.connection.dbapi_connection)

    elif moment == "statement":

        @event.listens_for(store.engine, "before_cursor_execute")
        def _before_statement(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if statement.startswith(statement_starting):
                cut(cursor.connection)

    else:

        @event.listens_for(store.engine, "commit")
        def _before_commit(conn: Any) -> None:
            cut(conn.connection.dbapi_connection)

    return cutter.cuts


def lose_the_commit_answer_once(store: Store, admin_dsn: str, *, skip: int = 0) -> list[int]:
    """The next COMMIT (the `skip` before it left alone) lands, then its backend is terminated
    before the answer comes back; returns the backend pids cut (one, once it happened)."""
    cutter = _BackendCutter(admin_dsn, skip)

    @event.listens_for(store.engine, "commit")
    def _commit_then_cut(conn: Any) -> None:
        if cutter.due():
            dbapi_connection = conn.connection.dbapi_connection
            dbapi_connection.commit()  # the server commits ...
            dbapi_connection.execute("BEGIN")  # (so that the driver's own COMMIT goes to the server)
            cutter.cut(dbapi_connection)  # ... and the answer is lost

    return cutter.cuts


def lose_a_commit(store: Store, admin_dsn: str, lost: str, *, skip: int = 0) -> list[int]:
    """The next COMMIT (after `skip`) lost "before it landed" or lost "its answer"."""
    if lost == "before it landed":
        return cut_connection_once(store, "commit", admin_dsn, skip=skip)
    return lose_the_commit_answer_once(store, admin_dsn, skip=skip)


def invalidations(store: Store) -> list[BaseException | None]:
    """The connections invalidated from now on: a COMMIT the driver saw fail is one."""
    invalidated: list[BaseException | None] = []

    @event.listens_for(store.engine, "invalidate")
    def _invalidated(_dbapi_connection: Any, _record: Any, exception: BaseException | None) -> None:
        invalidated.append(exception)

    return invalidated


def counted(calls: list[int], fn: Callable[[], T]) -> Callable[[], T]:
    """`fn`, noting each time the lane runs it."""

    def run() -> T:
        calls.append(1)
        return fn()

    return run


def test_a_connection_cut_during_a_statement_is_tried_again_and_applied_once(store: Store, pg_dsn: str) -> None:
    cuts = cut_connection_once(store, "statement", pg_dsn)
    calls: list[int] = []
    result = anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: store.cancel(ids=[1])))
    assert len(cuts) == 1 and len(calls) == 2  # the cut transaction was rolled back, then run again
    assert result == CancelResult(canceled=1, in_flight=0)
    assert store.status_counts()["canceled"] == 1


def test_a_commit_cut_before_it_landed_is_found_not_applied_and_tried_again(store: Store, pg_dsn: str) -> None:
    """The backend is terminated as the COMMIT goes out. The store asks the server what
    became of the transaction (aborted), so the lane runs it again, once, and it applies once."""
    cuts = cut_connection_once(store, "commit", pg_dsn)
    calls: list[int] = []
    result = anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: store.cancel(ids=[1])))
    assert len(cuts) == 1 and len(calls) == 2
    assert result == CancelResult(canceled=1, in_flight=0)
    assert store.status_counts()["canceled"] == 1


def test_a_commit_whose_answer_was_lost_is_found_committed_and_not_run_again(store: Store, pg_dsn: str) -> None:
    """The COMMIT lands but its answer never comes back (the backend is terminated right after):
    the server says the transaction committed, so the caller goes on with its result, run once."""
    cuts = lose_the_commit_answer_once(store, pg_dsn)
    lost = invalidations(store)  # the driver's COMMIT did fail: the answer was lost

    calls: list[int] = []
    result = anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: store.cancel(ids=[1])))
    assert len(cuts) == 1 and len(lost) == 1
    assert len(calls) == 1  # not run again: that would have canceled nothing
    assert result == CancelResult(canceled=1, in_flight=0)
    assert store.status_counts()["canceled"] == 1


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(lambda s: s.take_batch("w1", 30.0), id="the batch loop's idle poll"),
        pytest.param(lambda s: s.release_batch_leases("w1"), id="batch leases let go"),
        pytest.param(lambda s: s.retire_worker("w1"), id="a worker retired"),
    ],
)
def test_a_lost_commit_of_a_rerunnable_step_is_run_again_not_fatal(
    store: Store, pg_dsn: str, step: Callable[[Store], object]
) -> None:
    """A daemon's idle loops commit these every poll interval without the claim lock (no
    transaction id to ask about). Their end state is the same however often they run, so a
    backend terminated at their COMMIT is ridden out instead of stopping the daemon."""
    cuts = cut_connection_once(store, "commit", pg_dsn)
    calls: list[int] = []
    anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: step(store)))
    assert len(cuts) == 1 and len(calls) == 2


@pytest.mark.parametrize("lost", ["before it landed", "its answer"])
def test_a_lost_commit_of_a_job_step_is_resolved_not_fatal_and_never_run_twice(
    store: Store, pg_dsn: str, lost: str
) -> None:
    """A job's steps take no claim lock, and starting one must not run twice: run again after its
    COMMIT landed, `set_job_phase(starting=True)` would find the job started and say it did not
    start it. The step learns its transaction id first, so a lost COMMIT is asked about: not
    landed, it runs again; landed, its own answer stands. Before, either stopped the daemon."""
    store.stage_job({"id": "j"}, [], capacity=5, daily_budget=None)
    cuts = lose_a_commit(store, pg_dsn, lost)
    invalidated = invalidations(store)  # the driver's COMMIT did fail: its answer never came
    calls: list[int] = []
    started = anyio.run(
        DbLane(retry_seconds=10).run, counted(calls, lambda: store.set_job_phase("j", "calling", starting=True))
    )
    assert len(cuts) == 1 and len(invalidated) == 1 and started is True
    assert len(calls) == (2 if lost == "before it landed" else 1)
    job = store.get_job("j")
    assert job is not None and job["phase"] == "calling" and job["started_at"] is not None


def test_a_connection_cut_under_a_group_commit_sent_in_one_round_trip_is_tried_again(store: Store, pg_dsn: str) -> None:
    """A group commit sends its lock, its writes and its claim's reads together (one query,
    outside SQLAlchemy's execute): a backend terminated under them is the same transient,
    retried failure as under any statement, and the group is written once."""
    taken = store.claim("w", lease_seconds=30, global_limit=1, pool_limit=lambda _: 1, max_attempts=3, max_claims=1)
    (call,) = taken.requests
    cuts = cut_connection_once(store, "begin", pg_dsn)
    calls: list[int] = []
    limits = {"lease_seconds": 30, "global_limit": 1, "pool_limit": lambda _: 1, "max_attempts": 3, "max_claims": 1}
    group: list[Outcome] = [Completed(call, call.attempt, "paid", 3)]
    recorded = anyio.run(
        DbLane(retry_seconds=10).run,
        counted(calls, lambda: store.record(group, claim_for="w", reclaim=False, **limits)),
    )
    assert len(cuts) == 1 and len(calls) == 2
    assert recorded.written == [Written.APPLIED]
    assert recorded.claim is not None and [r.id for r in recorded.claim.requests] == [2]
    counts = store.status_counts()
    assert (counts["completed"], counts["running"], counts["queued"]) == (1, 1, 0)
    row = store.get_request(call.id)
    assert row is not None and [a["outcome"] for a in row["attempt_rows"]] == ["succeeded"]


def batch_group(store: Store, n: int = 2) -> BatchGroup:
    """`n` queued batch requests for openai, as one group due for a batch."""
    add_requests(store, n, model="gpt-4o-mini", provider="openai", delivery="batch")
    (group,) = store.batch_groups(0)
    return group


def opened(store: Store) -> BatchLease:
    """A batch opened for the queued batch requests, with them attached (status `submitting`)."""
    group = batch_group(store)
    lease = store.open_batch(group, "w1", 30.0, "submit-key")
    assert len(store.attach(lease, store.group_request_ids(group, 10), 100)) == group.queued
    return lease


@pytest.mark.parametrize("lost", ["before it landed", "its answer"])
@pytest.mark.parametrize("step", ["open a batch", "mark it submitted"])
def test_a_lost_commit_of_a_batch_step_is_resolved_not_fatal_and_never_run_twice(
    store: Store, pg_dsn: str, lost: str, step: str
) -> None:
    """Run again after its COMMIT landed, opening a batch would leave a second batch row for the
    same requests, and marking one submitted would find its lease let go (the step fails). Each
    learns its transaction id first: not landed, it runs again; landed, its own answer stands."""
    if step == "open a batch":
        group = batch_group(store)
        run: Callable[[], object] = lambda: store.open_batch(group, "w1", 30.0, "submit-key")  # noqa: E731
    else:
        lease = opened(store)
        run = lambda: store.mark_submitted(lease, "batch_abc", "validating", 60.0)  # noqa: E731
    cuts = lose_a_commit(store, pg_dsn, lost)
    invalidated = invalidations(store)
    calls: list[int] = []
    answer = anyio.run(DbLane(retry_seconds=10).run, counted(calls, run))
    assert len(cuts) == 1 and len(invalidated) == 1
    assert len(calls) == (2 if lost == "before it landed" else 1)
    (batch,) = rows(store, batches_t)  # one batch row, whatever the COMMIT's fate
    if step == "open a batch":
        assert isinstance(answer, BatchLease) and answer.id == batch["id"] and batch["status"] == "queued"
    else:
        assert (batch["status"], batch["provider_batch_id"], batch["lease_owner"]) == ("submitted", "batch_abc", None)


@pytest.mark.parametrize("cut", ["during it", "at its COMMIT, before it landed", "at its COMMIT, its answer"])
def test_a_failed_statistics_refresh_after_an_attach_leaves_the_attach_as_it_is(
    store: Store, pg_dsn: str, cut: str
) -> None:
    """The attach commits, then refreshes the planner's statistics in a transaction of its own. That
    one is only a speed-up: its failure is logged, not raised. Raised, a connection cut during it
    (a transient failure) had the lane run the whole attach again, find its requests no longer
    queued and delete the batch they are attached to; one at its COMMIT stopped the daemon."""
    group = batch_group(store)
    lease = store.open_batch(group, "w1", 30.0, "submit-key")
    ids = store.group_request_ids(group, 10)
    if cut == "during it":
        cuts = cut_connection_once(store, "statement", pg_dsn, statement_starting="ANALYZE")
    else:  # the attach's own COMMIT goes through
        cuts = lose_a_commit(store, pg_dsn, cut.removeprefix("at its COMMIT, "), skip=1)
    calls: list[int] = []
    with kept_records("ledger.store", logging.WARNING) as warnings:
        attached = anyio.run(DbLane(retry_seconds=10).run, counted(calls, lambda: store.attach(lease, ids, 100)))
    assert len(cuts) == 1 and len(calls) == 1
    (said,) = [r for r in warnings.records if r.getMessage() == "statistics not refreshed after attaching a batch"]
    assert said.details["batch_id"] == lease.id  # type: ignore[attr-defined]
    assert attached == sorted(ids)
    (batch,) = rows(store, batches_t)
    assert (batch["id"], batch["status"], batch["request_total"]) == (lease.id, "submitting", len(ids))
    assert store.batch_request_ids(lease.id) == sorted(ids)


def test_a_cancel_sent_whose_note_failed_says_so_and_stays_marked_for_the_daemon(
    store: Store, pg_url: str, pg_dsn: str
) -> None:
    """`ledger cancel --batch`: the provider took the cancel, then noting it in the ledger failed (the
    backend terminated). One line says so, not a traceback; the cancel stays marked, unsent as far as
    the ledger knows, so a daemon's next poll of the batch sends it again."""
    with running_mock_provider(batch_latency=30) as mock:
        lease = opened(store)
        client = openai.OpenAI(base_url=mock.openai_base_url, api_key="test-key")
        line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt-4o-mini"}}
        uploaded = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
        created = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        store.mark_submitted(lease, created.id, created.status, 60.0)
        cuts = cut_connection_once(store, "begin", pg_dsn, skip=1)  # the cancel is marked, then its note is cut
        said = cancel_batches(store, batch_settings(pg_url, mock), batch_id=lease.id)
        assert len(cuts) == 1
        (only,) = said
        assert re.fullmatch(
            rf"batch {lease.id}: openai says cancell(ing|ed); the ledger could not note it \(.+\), "
            r"so a daemon sends the cancel again at its next poll \(unless the note landed\)",
            only,
        ), only
        assert client.batches.retrieve(created.id).status in ("cancelling", "cancelled")
    batch = store.get_batch(lease.id)
    assert batch is not None and batch["cancel_requested_at"] is not None and batch["cancel_sent_at"] is None


def test_a_database_failure_reaches_the_lane_s_caller_as_the_store_s_own_error(db_url: str) -> None:
    """Callers outside the store catch `DatabaseUnavailable`, never the driver's errors: what the
    lane could not get past comes as that, the driver's error as its cause, told as the driver's."""
    store = Store(db_url)

    def read_a_missing_table() -> None:
        with store.engine.connect() as conn:
            conn.execute(text("SELECT * FROM no_such_table"))

    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            anyio.run(DbLane(0.5).run, read_a_missing_table)
        assert isinstance(caught.value.__cause__, DBAPIError)
        assert one_line(caught.value) == one_line(caught.value.__cause__)
        assert "no_such_table" in one_line(caught.value)
    finally:
        store.close()
