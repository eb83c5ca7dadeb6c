"""Windows the ledger learned from a provider's 429s: how many calls it takes per how many seconds.

A provider whose headers count a requests window down without saying when it resets (an
OpenAI-compatible proxy's), or that says nothing at all, still refuses the call past its
window. Such a refusal is a window's, not a concurrency cap's (`pool_lessons._note_pool`), and
the window is learned from it: its calls are the limit the headers name (else the calls the
pool started in it), its length the wait the 429 asked for (else a minute, what the providers'
request headers count over). From then on the pool is paced like one with a configured RPM
(`PoolRules.learned`): its calls are logged in `llm_pool_calls`, and claims start no more than
the window takes. The log is seeded with the calls the pool made in the window so far, which the
provider counted too.
Called only from `Store` methods, inside their transactions.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, exists, func, insert, literal, or_, select
from sqlalchemy.engine import Connection

from ledger.models import LlmAttempt, LlmPoolCall, LlmRequest
from ledger.statuses import AttemptOutcome, RequestStatus
from ledger.store.dialect import db_now_plus

requests = LlmRequest.__table__  # type: ignore[attr-defined]
attempts = LlmAttempt.__table__  # type: ignore[attr-defined]
calls = LlmPoolCall.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class LearnedWindow:
    """A pool's window as a 429 taught it: `calls` per `seconds`; `seconds` None: only the
    window's size, as an answer's `x-ratelimit-limit-requests` said it (kept for a lesson to come)."""

    endpoint: str
    calls: int
    seconds: float | None


def seed_log(conn: Connection, endpoint: str, seconds: float) -> int:
    """Log the pool's calls of the last `seconds` that the provider counted (answered, or still
    out) and the log does not hold yet; returns how many the log now holds for that time.

    Read through the requests still running and those completed in that time (both indexed),
    each at its latest attempt: a 429'd attempt is not counted by the provider."""
    since = db_now_plus(-seconds)
    r, a = requests.c, attempts.c
    logged = exists().where(calls.c.request_id == a.request_id, calls.c.attempt == a.attempt)
    counted = (
        select(literal(endpoint), a.request_id, a.attempt, literal(0), a.started_at)
        .select_from(requests.join(attempts, and_(a.request_id == r.id, a.attempt == r.attempts)))
        .where(
            r.endpoint == endpoint,
            or_(r.status == RequestStatus.RUNNING.value, r.completed_at > since),
            a.started_at > since,
            a.outcome.in_([AttemptOutcome.SUCCEEDED.value, AttemptOutcome.RUNNING.value]),
            ~logged,
        )
    )
    columns = ["endpoint", "request_id", "attempt", "tokens", "started_at"]
    conn.execute(insert(calls).from_select(columns, counted))
    in_log = select(func.count()).where(calls.c.endpoint == endpoint, calls.c.started_at > since)
    return int(conn.execute(in_log).scalar_one())


def refused_since(conn: Connection, request_id: int, attempt: int, seconds: float) -> bool:
    """Whether a request's attempts before `attempt` end in a run of 429s that began at least
    `seconds` ago (any other outcome, or an attempt that never answered, ends a run)."""
    before = and_(attempts.c.request_id == request_id, attempts.c.attempt < attempt)
    other = or_(attempts.c.status_code.is_(None), attempts.c.status_code != 429)
    last_other = select(func.coalesce(func.max(attempts.c.attempt), 0)).where(before, other).scalar_subquery()
    began = select(func.min(attempts.c.started_at)).where(before, attempts.c.attempt > last_other).scalar_subquery()
    return bool(conn.execute(select(began <= db_now_plus(-seconds))).scalar())
