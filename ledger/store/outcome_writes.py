"""The statements a group commit writes its outcomes with (`queue.py`'s `record`), and the group
itself: each outcome as one row, the rows of one kind written by one statement, and what each
statement of the commit's single round trip returned, by name.

Every write to a claimed row carries its fencing token and `status='running'`: a worker whose
lease was taken over, or whose request was canceled, changes nothing (cancel wins over a late
completion).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from sqlalchemy import BigInteger, Float, Integer, String, Text, bindparam, column, func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnClause

from ledger.statuses import AnsweredVia, AttemptOutcome, RequestStatus
from ledger.store import answers
from ledger.store.cache import ENDED, TWINS_ANSWERED, TWINS_RELEASED
from ledger.store.claim import QUEUED, RUNNING
from ledger.store.dialect import Dialect, Ran, db_now, db_now_plus, storable, unindexed
from ledger.store.row_sets import bound_rows
from ledger.store.rows import Completed, Failed, Outcome, RetryLater, Written
from ledger.store.tables import attempts, requests


def _kind(outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        return "completed"
    if isinstance(outcome, Failed):
        return "failed"
    if outcome.pause is not None or outcome.uncounted:
        return "parked"
    return "retry_hold" if outcome.hold_slot else "retry_release"


_EXPECTED_STATUS = {
    "completed": RequestStatus.COMPLETED.value,
    "failed": RequestStatus.ERROR.value,
    "retry_hold": RUNNING,
    "retry_release": QUEUED,
    "parked": QUEUED,
}


# A group's outcomes, one row each (`_outcome_row`), as one set of rows (`bound_rows`): each
# statement below writes the whole group at once. Per-row statements (an executemany) cost SQLite a step per
# row, and every step hands the GIL to the event loop and waits to get it back: under HTTP
# load that waiting was most of a group commit's time (issue 9).
def _outcome_columns() -> list[ColumnClause[Any]]:
    return [
        column("id", BigInteger),
        column("token", BigInteger),
        column("attempt", Integer),
        column("outcome", String),
        column("status", Integer),
        column("code", String),
        column("message", Text),
        column("latency", Integer),  # the attempt's
        column("elapsed", Integer),  # the request's, over all its attempts (a final failure)
        column("delay", Float),
        column("raw", Text),
        column("tin", Integer),
        column("tout", Integer),
        column("cost", Float),
        column("why", Text),
        *answers.answer_columns(),
    ]


# Answers parsed where they were received (a request with `parse`): their derived fields, in a
# statement of their own, so a group without any pays nothing for them.
_D = bound_rows(
    "d",
    "b_derived",
    column("id", BigInteger),
    column("token", BigInteger),
    *answers.derived_columns(),
    keys="b_derived_ids",
)
_WRITE_DERIVED = (
    update(requests)
    .where(
        _D.match(requests.c.id),
        requests.c.lease_token == _D.c.token,
        unindexed(requests.c.status) == RequestStatus.COMPLETED.value,
    )
    .values(**answers.derived_values(_D.c))
)
_V = bound_rows("v", "b_rows", *_outcome_columns(), keys="b_row_ids")  # the outcomes of one kind (request rows)
_VA = bound_rows("va", "b_attempts", *_outcome_columns(), keys="b_attempt_ids")  # the whole group (attempt rows)
_v, _va = _V.c, _VA.c


def _outcome_row(o: Outcome) -> dict[str, Any]:
    """One outcome as a row of `_V`: what its attempt row and its request row get."""
    row: dict[str, Any] = {"id": o.request.id, "token": o.request.token, "attempt": o.attempt}
    if isinstance(o, Completed):
        return (
            row
            | {
                "outcome": AttemptOutcome.SUCCEEDED.value,
                "status": o.status_code,
                "latency": o.latency_ms,
                "elapsed": o.latency_ms,
                "raw": storable(o.raw_output),
                "tin": o.input_tokens,
                "tout": o.output_tokens,
                "cost": o.cost_usd,
            }
            | answers.answer_row(o.answer)
        )
    f = o.failure
    timed_out = isinstance(o, RetryLater) and f.error_code == "timeout"
    row |= {
        "outcome": (AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.FAILED).value,
        "status": f.status_code,
        "code": f.error_code,
        "message": storable(f.message),
        "latency": f.latency_ms,
    }
    if isinstance(o, Failed):
        return row | {"elapsed": o.elapsed_ms}
    return row | {"delay": o.delay_s}


# Fenced like the request row: only a `running` attempt is closed by its call's outcome. One
# a takeover already marked `lost` stays lost, so the audit keeps the takeover (issue 12).
_FINISH_ATTEMPTS = (
    update(attempts)
    .where(
        _VA.match(attempts.c.request_id),
        attempts.c.attempt == _va.attempt,
        unindexed(attempts.c.outcome) == AttemptOutcome.RUNNING.value,
    )
    .values(
        outcome=_va.outcome,
        status_code=_va.status,
        error_code=_va.code,
        error_message=_va.message,
        retry_delay_s=_va.delay,
        latency_ms=_va.latency,
        finished_at=db_now(),
    )
)


def _fenced_update(*, canceling: bool = False) -> Any:
    """UPDATE of the rows these leases still hold: same token, still `running`.

    Live rows (no cancel waiting) get the outcome as reported; rows whose cancel
    is waiting for this call (`canceling=True`) end `canceled` instead.
    """
    c = requests.c
    waiting = c.cancel_requested_at.is_not(None) if canceling else c.cancel_requested_at.is_(None)
    # Reached by primary key from each outcome: `status` unindexed, or SQLite's planner scans the
    # in-flight index and probes the group for every running row (3 ms a group of 40, not 0.5).
    return update(requests).where(_V.match(c.id), c.lease_token == _v.token, unindexed(c.status) == RUNNING, waiting)


_FENCE_STATE = select(requests.c.id, requests.c.lease_token, requests.c.status, requests.c.cancel_requested_at).where(
    requests.c.id.in_(bindparam("b_ids", expanding=True))
)
# A final outcome settles the budget: the reservation goes, the real cost (if any) stays.
_FINAL = {
    "completed_at": db_now(),
    "lease_owner": None,
    "lease_expires_at": None,
    "reserved_usd": None,
    "updated_at": db_now(),
}
_RETRY = {
    "next_attempt_at": db_now_plus(_v.delay),
    "last_status_code": _v.status,
    "error_code": _v.code,
    "error_message": _v.message,
    "updated_at": db_now(),
}
_OUTPUT: dict[str, Any] = {
    "raw_output": _v.raw,
    "input_tokens": _v.tin,
    "output_tokens": _v.tout,
    "cost_usd": _v.cost,
    "latency_ms": _v.latency,
    "last_status_code": _v.status,
    **answers.answer_values(_v),
}
_REQUEST_UPDATES = {
    "completed": _fenced_update().values(
        status=RequestStatus.COMPLETED.value,
        error_code=None,
        error_message=None,
        answered_via=AnsweredVia.ONLINE.value,
        **_OUTPUT,
        **_FINAL,
    ),
    "failed": _fenced_update().values(
        status=RequestStatus.ERROR.value,
        error_code=_v.code,
        error_message=_v.message,
        last_status_code=_v.status,
        latency_ms=_v.elapsed,
        **_FINAL,
    ),
    "retry_hold": _fenced_update().values(**_RETRY),
    "retry_release": _fenced_update().values(
        status=QUEUED, lease_owner=None, lease_expires_at=None, reserved_usd=None, **_RETRY
    ),
    # A spent quota, or a 429 the ledger waits out: back to the queue, the attempt not counted
    # against the retry limit (`parked`).
    "parked": _fenced_update().values(
        status=QUEUED,
        lease_owner=None,
        lease_expires_at=None,
        reserved_usd=None,
        parked=requests.c.parked + 1,
        **_RETRY,
    ),
}
# The same, closing the group's attempts in the same statement where the database can (PostgreSQL:
# a data-modifying CTE; a round trip fewer per group commit).
_WITH_ATTEMPTS = {kind: stmt.add_cte(_FINISH_ATTEMPTS.cte("finished")) for kind, stmt in _REQUEST_UPDATES.items()}
# A cancel was waiting for this call: the request ends `canceled`, and what the call
# returned is kept beside it (it was paid for), never presented as `completed`.
_CANCELED_IN_FLIGHT: dict[str, Any] = {
    "status": RequestStatus.CANCELED.value,
    "error_code": "canceled",
    "error_message": func.coalesce(_v.why, "canceled while a call was in flight"),
    **_FINAL,
}
_CANCEL_UPDATES = {
    "completed": _fenced_update(canceling=True).values(**_OUTPUT, **_CANCELED_IN_FLIGHT),
    # A failed call, or none (a cancel seen after a back-off): the last status the provider gave stays.
    "other": _fenced_update(canceling=True).values(
        last_status_code=func.coalesce(_v.status, requests.c.last_status_code), **_CANCELED_IN_FLIGHT
    ),
}


def cancel_waiting(conn: Connection, dialect: Dialect, row: dict[str, Any], *, answered: bool = False) -> bool:
    """End a request whose cancel was waiting for its call (`row`: an outcome's row, or id, token
    and `why`): `canceled`, with what an `answered` call returned kept beside it."""
    stmt = _CANCEL_UPDATES["completed" if answered else "other"]
    return bool(dialect.execute(conn, stmt, _V.bind([row])).rowcount)


def _sort_out(conn: Connection, dialect: Dialect, outcomes: list[Outcome]) -> list[Written]:
    """Per outcome, after the live updates: applied, ended by a waiting cancel, or refused."""
    state = {row.id: row for row in conn.execute(_FENCE_STATE, {"b_ids": [o.request.id for o in outcomes]})}
    written = []
    for o in outcomes:
        row = state.get(o.request.id)
        if row is None or row.lease_token != o.request.token:
            written.append(Written.REFUSED)
        elif row.cancel_requested_at is None and row.status == _EXPECTED_STATUS[_kind(o)]:
            written.append(Written.APPLIED)
        elif row.status == RUNNING and row.cancel_requested_at is not None:
            ended = cancel_waiting(conn, dialect, _outcome_row(o), answered=isinstance(o, Completed))
            written.append(Written.CANCELED if ended else Written.REFUSED)
        else:
            written.append(Written.REFUSED)
    return written


@dataclass(frozen=True)
class GroupRan:
    """What the group commit's one round trip returned, by what each statement was for."""

    updates: list[Ran]  # the group's updates, in `OutcomeGroup.updates` order
    twins_answered: list[tuple[int, int]]  # (twin id, id of the request that answered it)
    claim_reads: list[Ran]  # the claim's reads sent along (`ClaimReads.statements`), if any


class OutcomeGroup:
    """One group commit's outcomes: its rows, its statements, and what became of each outcome."""

    def __init__(self, outcomes: list[Outcome], dialect: Dialect) -> None:
        self.outcomes = outcomes
        self.rows = [_outcome_row(o) for o in outcomes]
        self.endpoints = {o.request.endpoint for o in outcomes}
        self.by_kind: dict[str, list[dict[str, Any]]] = {}
        for o, row in zip(outcomes, self.rows, strict=True):
            self.by_kind.setdefault(_kind(o), []).append(row)
        self._dialect = dialect
        # Then the twins of the requests this group ended (response cache): answered from them,
        # or released when they ended without a source's answer.
        ended = ENDED.bind([{"id": o.request.id} for o in outcomes])
        self.twins = [(TWINS_ANSWERED, ended), (TWINS_RELEASED, ended)]

    @cached_property
    def updates(self) -> list[tuple[Any, dict[str, Any]]]:
        """One statement per kind of change, the whole group as one parameter each."""
        group = _VA.rows(self.rows)
        updates: list[tuple[Any, dict[str, Any]]] = []
        for i, (kind, of_kind) in enumerate(self.by_kind.items()):
            params = _V.bind(group if len(of_kind) == len(self.rows) else of_kind)
            if i == 0:  # the group's attempts are closed with the first kind's requests
                both = self._dialect.as_one(_WITH_ATTEMPTS[kind], (_FINISH_ATTEMPTS, _REQUEST_UPDATES[kind]))
                params |= _VA.bind(group)
                updates += [(stmt, params) for stmt in both]
            else:
                updates.append((_REQUEST_UPDATES[kind], params))
        return updates

    @property
    def freed(self) -> int:
        """Slots this group frees (a held retry keeps its own)."""
        return sum(len(of_kind) for kind, of_kind in self.by_kind.items() if kind != "retry_hold")

    def results(self, ran: list[Ran]) -> GroupRan:
        """`ran`: the results of `updates`, then `twins`, then the claim's reads, in that order."""
        updates, twins = len(self.updates), len(self.twins)
        answered = [(int(i), int(c)) for i, c in ran[updates].rows]
        return GroupRan(ran[:updates], answered, ran[updates + twins :])

    def all_matched(self, ran: GroupRan) -> bool:
        """Every fenced update matched its row (the usual case): nothing more to read."""
        counted = [r for (stmt, _), r in zip(self.updates, ran.updates, strict=True) if stmt is not _FINISH_ATTEMPTS]
        return sum(r.rowcount for r in counted) == len(self.outcomes)

    def sort_out(self, conn: Connection) -> list[Written]:
        return _sort_out(conn, self._dialect, self.outcomes)

    def write_derived(self, conn: Connection, written: list[Written]) -> None:
        """The fields of answers parsed where they were received, for those that were written."""
        parsed = [
            answers.derived_row(o.request.id, o.derived, token=o.request.token)
            for o, w in zip(self.outcomes, written, strict=True)
            if w is Written.APPLIED and isinstance(o, Completed) and o.derived is not None
        ]
        if parsed:
            self._dialect.execute(conn, _WRITE_DERIVED, _D.bind(parsed))

    def answered(self, written: list[Written]) -> Counter[str]:
        """Answers written, per pool."""
        return Counter(
            o.request.endpoint
            for o, w in zip(self.outcomes, written, strict=True)
            if w is Written.APPLIED and isinstance(o, Completed)
        )
