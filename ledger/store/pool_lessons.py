"""What answers teach a pool: the provider's window, a limit learned from a 429, a window
learned from one, a cooldown, and probing back up after enough successes.

A group of outcomes is read here as the recorder writes it (`note_outcomes`, unless it is
`quiet`); what it teaches holds back every daemon's next claim (`pools.PoolRoom`). The rules
themselves are in `pools.py`'s docstring. Split from `pools.py`, which holds what a claim may
start; this module holds what the answers write.
Called only from `Store` methods, inside their transactions (the pool's turn held: docs/architecture.md).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, bindparam, case, func, or_, select, update
from sqlalchemy.engine import Connection

from ledger.models import LlmAttempt, LlmPool, LlmPoolCall, LlmRequest
from ledger.statuses import AttemptOutcome, RequestStatus
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.pool_rates import PoolRules
from ledger.store.pool_windows import LearnedWindow, seed_log
from ledger.store.rows import Completed, Outcome, PoolWindow, RetryLater

# A learned window is paced this much longer than the wait its 429 asked for: the provider counts a
# call when it arrives, the ledger when it starts it, so at the window's edge the ledger's log lets
# a call go a little before the provider's window has room for it (a 429 per window, without).
WINDOW_MARGIN = 0.05
# Rounds of full-limit successes before trying one more slot.
PROBE_ROUNDS = 10

pools = LlmPool.__table__  # type: ignore[attr-defined]
requests = LlmRequest.__table__  # type: ignore[attr-defined]
attempts = LlmAttempt.__table__  # type: ignore[attr-defined]
calls = LlmPoolCall.__table__  # type: ignore[attr-defined]


@dataclass
class _Heard:
    """One pool's outcomes in a group: its 429s, successes, and what its headers said."""

    rate_limited: int = 0
    retry_after: float | None = None
    # The fewest calls the recording daemon had out when one of these 429s came, and that 429.
    calls_out: tuple[int, int, int] | None = None  # (calls, request id, attempt)
    completed: int = 0
    remaining: int | None = None
    reset_s: float = 0.0
    answered_at: float = 0.0  # of the answer that said `remaining` (time.monotonic(), 0: unknown)
    limit: int | None = None  # the requests the window holds when whole, as the headers said
    settle: list[dict[str, Any]] = field(default_factory=list)

    def window(self, w: PoolWindow) -> None:
        """The tightest window heard in the group wins."""
        if w.limit is not None:
            self.limit = w.limit if self.limit is None else min(self.limit, w.limit)
        if self.remaining is None or w.remaining < self.remaining:
            self.remaining, self.reset_s, self.answered_at = w.remaining, w.reset_s, w.answered_at
        elif w.remaining == self.remaining:
            self.reset_s = max(self.reset_s, w.reset_s)
            self.answered_at = min(self.answered_at, w.answered_at)


def note_outcomes(
    conn: Connection, dialect: Dialect, outcomes: Iterable[Outcome], rules: PoolRules, windowed: Collection[str] = ()
) -> list[LearnedWindow]:
    """What a group of outcomes says about their pools: windows spent, limits learned, tokens used
    (nothing when they are `quiet`, which the caller asks first). Returns the windows its 429s
    taught, for the caller's rules (`PoolRules.learned`).

    Every 429 counts, whatever became of its row: it is what the provider said about the pool.
    `windowed`: pools held to a window the headers announced (the last claim saw them); only
    theirs is cleared when an answer says the window has room enough again.
    """
    heard: dict[str, _Heard] = {}
    for o in outcomes:
        if not isinstance(o, Completed | RetryLater) or (isinstance(o, RetryLater) and o.pause is not None):
            continue  # a spent quota teaches nothing about limits: it pauses the pool (`pause_pools`)
        h = heard.setdefault(o.request.endpoint, _Heard())
        if o.window is not None:
            h.window(o.window)
        rated = rules.capped(o.request.endpoint)
        if isinstance(o, Completed):
            h.completed += 1
            if rated and (o.input_tokens is not None or o.output_tokens is not None):
                used = (o.input_tokens or 0) + (o.output_tokens or 0)
                h.settle.append({"b_id": o.request.id, "b_attempt": o.attempt, "b_tokens": used})
        elif o.failure.status_code == 429:
            h.rate_limited += 1
            if o.calls_out is not None and (h.calls_out is None or o.calls_out < h.calls_out[0]):
                h.calls_out = (o.calls_out, o.request.id, o.attempt)
            asked = [x for x in (h.retry_after, o.pool_cooldown_s) if x]
            h.retry_after = max(asked) if asked else None
            if rated:  # refused: the provider used no tokens on it
                h.settle.append({"b_id": o.request.id, "b_attempt": o.attempt, "b_tokens": 0})
    learned = []
    for endpoint, h in sorted(heard.items()):
        lesson = _note_pool(conn, dialect, endpoint, h, endpoint in windowed, rules)
        if lesson is None and h.limit and h.limit != rules.heard.get(endpoint):
            lesson = LearnedWindow(endpoint, h.limit, None)  # the window's size, as the headers say now
        if lesson is not None:
            learned.append(lesson)
    settle = [s for h in heard.values() for s in h.settle]
    if settle:
        dialect.execute_many(conn, _SETTLE, settle)
    return learned


def quiet(outcomes: Iterable[Outcome], rules: PoolRules, windowed: Collection[str] = ()) -> bool:
    """Whether `note_outcomes` has nothing to write for these outcomes: no refusal, no capped
    pool, and every window the headers announced has more than `_MOST_CALLS` calls left in a
    pool not held to one. The usual group; a claim in its transaction may then read the pools'
    state before the group is noted (in the same round trip as the group's own writes)."""
    for o in outcomes:
        if not isinstance(o, Completed | RetryLater):
            continue
        endpoint = o.request.endpoint
        if rules.capped(endpoint) or (
            isinstance(o, RetryLater) and (o.failure.status_code == 429 or o.pause is not None)
        ):
            return False
        if o.window is not None and (o.window.remaining <= _MOST_CALLS or endpoint in windowed):
            return False
    return True


_SETTLE = (
    update(calls)
    .where(calls.c.request_id == bindparam("b_id"), calls.c.attempt == bindparam("b_attempt"))
    .values(tokens=bindparam("b_tokens"))
)


# How long before its answer a call may have been sent and still not reached the provider.
_IN_TRANSIT_S = 0.05
# The most calls a pool can have in flight (MAX_CONCURRENT_LLM_CALLS is at most 50): a window
# with more left than that has room for all of them, without counting.
_MOST_CALLS = 50


def _note_pool(
    conn: Connection, dialect: Dialect, endpoint: str, h: _Heard, windowed: bool, rules: PoolRules
) -> LearnedWindow | None:
    """What the provider's window has left: less the calls started since it answered (not
    counted there yet), that is what claims may start until the window is whole again
    (`window_left` until `window_until`); nothing left cools the pool down until a call can
    succeed again (a 429's retry-after, else the reset), then lets one call go, whose answer
    says how much room there is. Otherwise a 429 teaches the pool its limit, unless it is a
    window's (`_window_refusal`), which teaches the window (returned).

    Headers that count a window down without saying when it is whole again (an OpenAI-compatible
    proxy's) are read as a window as long as a 429's wait, else a minute (`rules.window_s`): the
    providers' request headers count per minute."""
    minute_s = rules.window_of(endpoint)  # a minute, or the window learned before
    reset = h.reset_s or _window_length(h, minute_s)
    left = h.remaining
    if left is not None and 0 < left <= _MOST_CALLS:
        left -= calls_started_since(conn, endpoint, h.answered_at)
    if left is not None and left <= 0:  # no room: wait for it, every daemon
        wait = h.retry_after if h.rate_limited and h.retry_after else h.reset_s
        if h.rate_limited and not h.reset_s:  # refused with the window spent, and told no reset
            return _window_refusal(conn, dialect, endpoint, h, _window_length(h, minute_s), rules)
        if wait:
            cool_down(conn, dialect, endpoint, wait)
        if reset > (wait or 0):
            values = {"window_left": 1, "window_until": db_now_plus(reset)}
            conn.execute(dialect.upsert(pools, ["endpoint"], {"endpoint": endpoint}, values))
        return None
    if left is not None and left <= _MOST_CALLS:
        values = {"window_left": left, "window_until": db_now_plus(reset)}
        conn.execute(dialect.upsert(pools, ["endpoint"], {"endpoint": endpoint}, values))
    elif left is not None and windowed and not h.rate_limited:
        # Room enough again: an earlier answer's window no longer holds back. Never on a refusal:
        # a window with room left for other calls still refused this one.
        open_window = and_(pools.c.endpoint == endpoint, pools.c.window_until.is_not(None))
        conn.execute(update(pools).where(open_window).values(window_left=None, window_until=None))
    if not h.rate_limited:
        return None
    if h.remaining is None and (windowed or h.limit is not None or endpoint in rules.windows):
        # No headers of its own, in a window the answers counted down (or one learned before).
        return _window_refusal(conn, dialect, endpoint, h, _window_length(h, minute_s), rules)
    if h.calls_out is not None:  # ours, counted when the 429 came; the other daemons', as the database knows them
        calls, request_id, attempt = h.calls_out
        in_flight = calls + calling_elsewhere(conn, endpoint, request_id, attempt)
    else:  # not counted (a caller of the store's own): the calls still open, and those answered with it
        in_flight = calling(conn, endpoint) + h.completed
    if in_flight == 0:  # alone at the provider and refused: a window, not concurrency
        return _window_refusal(conn, dialect, endpoint, h, _window_length(h, minute_s), None)
    learn_limit(conn, dialect, endpoint, in_flight)
    return None


def _window_length(h: _Heard, minute_s: float) -> float:
    """How long a window that did not say when it resets lasts: the wait its 429 asked for,
    else a minute (what `x-ratelimit-*-requests` count over, by the providers' convention)."""
    return h.retry_after if h.rate_limited and h.retry_after else minute_s


def _window_refusal(
    conn: Connection, dialect: Dialect, endpoint: str, h: _Heard, wait: float, rules: PoolRules | None
) -> LearnedWindow | None:
    """A 429 from a window, not from too many calls at once, that asked to wait `wait`.

    With `rules`, the answers counted the window down (the evidence a window is learned from):
    the window is learned (`pool_windows`: the headers' limit, else the one learned before, else
    the calls the pool made in it, per `wait`) and paces the pool from then on; its calls in the
    window, logged, hold the pool until they leave it (the pool cools down for `wait` only when
    none of its calls were, another client's having spent the window). The next call goes alone
    (`window_left` 1): its answer says how much room there is.
    Without, the 429 came with nothing else out, which shows that the limit learned from the 429s
    before it was a window's too (each looked like a concurrency cap while other calls were out):
    it goes, and the pool cools down for `wait`. Nothing counted how many calls such a window
    takes, so none is learned (a passing 429 would pace a pool for good)."""
    if rules is None:
        cool_down(conn, dialect, endpoint, wait)
        conn.execute(
            update(pools)
            .where(pools.c.endpoint == endpoint, pools.c.learned_limit.is_not(None), pools.c.paused_reason.is_(None))
            .values(learned_limit=None, successes=0, updated_at=db_now())
        )
        return None
    paced = wait * (1 + WINDOW_MARGIN)
    seeded = seed_log(conn, endpoint, paced)
    if not seeded:
        cool_down(conn, dialect, endpoint, wait)
    values: dict[str, Any] = {"window_left": 1, "window_until": db_now_plus(wait * 2)}
    conn.execute(dialect.upsert(pools, ["endpoint"], {"endpoint": endpoint}, values))
    known = rules.heard.get(endpoint) or (rules.rpm.get(endpoint) if endpoint in rules.windows else None)
    return LearnedWindow(endpoint, max(h.limit or known or seeded, 1), paced)


def learn_limit(conn: Connection, dialect: Dialect, endpoint: str, at_most: int) -> None:
    """The provider serves at most `at_most` calls of this pool at once: the learned limit drops to
    that (never rises by it). One statement: two daemons' lessons both hold (the lower wins)."""
    known = pools.c.learned_limit
    lowered = case((or_(known.is_(None), known > at_most), at_most), else_=known)
    values: dict[str, Any] = {"successes": 0, "updated_at": db_now()}
    first = {"endpoint": endpoint, "learned_limit": at_most}
    conn.execute(dialect.upsert(pools, ["endpoint"], first, values, on_conflict={"learned_limit": lowered}))


def cool_down(conn: Connection, dialect: Dialect, endpoint: str, seconds: float) -> None:
    """No claim of this pool, by any daemon, for `seconds`; a shorter wait never cuts a longer one short."""
    until = db_now_plus(seconds)
    later = case((pools.c.cooldown_until > until, pools.c.cooldown_until), else_=until)
    first = {"endpoint": endpoint, "cooldown_until": until}
    conn.execute(
        dialect.upsert(pools, ["endpoint"], first, {"updated_at": db_now()}, on_conflict={"cooldown_until": later})
    )


_CALLING = (
    select(func.count())
    .select_from(
        requests.join(attempts, and_(attempts.c.request_id == requests.c.id, attempts.c.attempt == requests.c.attempts))
    )
    .where(
        requests.c.endpoint == bindparam("b_endpoint"),
        requests.c.status == RequestStatus.RUNNING.value,
        attempts.c.outcome == AttemptOutcome.RUNNING.value,
    )
)


def calls_started_since(conn: Connection, endpoint: str, answered_at: float) -> int:
    """The pool's calls out (every daemon's) started since an answer came (`time.monotonic()`;
    0: unknown, then every call out counts): the provider had not counted them in it."""
    if not answered_at:
        return calling(conn, endpoint)
    since = max(time.monotonic() - answered_at, 0.0) + _IN_TRANSIT_S
    query = _CALLING.where(attempts.c.started_at > db_now_plus(bindparam("b_ago")))
    return int(conn.execute(query, {"b_endpoint": endpoint, "b_ago": -since}).scalar_one())


def calling(conn: Connection, endpoint: str) -> int:
    """The pool's calls at the provider now, every daemon's: running rows with an open attempt
    (a retry sleeping through its back-off holds a slot but calls nobody)."""
    return int(conn.execute(_CALLING, {"b_endpoint": endpoint}).scalar_one())


def calling_elsewhere(conn: Connection, endpoint: str, request_id: int, attempt: int) -> int:
    """The pool's calls at the provider now from daemons other than the one that made this attempt."""
    made_by = (
        select(attempts.c.worker)
        .where(attempts.c.request_id == request_id, attempts.c.attempt == attempt)
        .scalar_subquery()
    )
    query = _CALLING.where(attempts.c.worker != made_by)
    return int(conn.execute(query, {"b_endpoint": endpoint}).scalar_one())


def _running_in_sql(endpoint: str) -> Any:
    return (
        select(func.count())
        .where(requests.c.endpoint == endpoint, requests.c.status == RequestStatus.RUNNING.value)
        .scalar_subquery()
    )


def note_successes(conn: Connection, counts: Mapping[str, int], probe_seconds: float) -> None:
    """Successes per pool with a learned limit: enough of them in a row, and long enough, add one
    slot. A paused pool's probe that succeeded ends its pause, and the limit it was held to."""
    conn.execute(
        update(pools)
        .where(pools.c.endpoint.in_(sorted(counts)), pools.c.paused_reason.is_not(None))
        .values(paused_reason=None, learned_limit=None, successes=0, updated_at=db_now())
    )
    for endpoint, n in sorted(counts.items()):
        conn.execute(
            update(pools)
            .where(pools.c.endpoint == endpoint, pools.c.learned_limit.is_not(None))
            .values(successes=pools.c.successes + n)
        )
    conn.execute(
        update(pools)
        .where(
            pools.c.endpoint.in_(list(counts)),
            pools.c.successes >= pools.c.learned_limit * PROBE_ROUNDS,
            pools.c.updated_at <= db_now_plus(-probe_seconds),
        )
        .values(learned_limit=pools.c.learned_limit + 1, successes=0, updated_at=db_now())
    )


def over_learned_limit(conn: Connection, endpoint: str) -> bool:
    """More of the pool's requests in flight than its learned limit allows."""
    row = conn.execute(
        select(pools.c.learned_limit, _running_in_sql(endpoint)).where(pools.c.endpoint == endpoint)
    ).first()
    return row is not None and row[0] is not None and int(row[1]) > int(row[0])
