"""Shared endpoint-pool state: what each pool may start now, and what its answers taught it.

Every daemon reads this in its claim transaction, so what one process learns
about an endpoint holds back all of them:
- **Learned limit, in one step.** A retryable 429 says the provider serves at most
  what the pool had in flight when it refused the call: the recording daemon's other
  calls out then (counted by its executor, `RetryLater.calls_out`) plus the other
  daemons' calls at the provider (their open attempts). The learned limit drops to
  that at once (never raised by it), once per group (the smallest count), so a burst
  of 429s from one overshoot is one lesson, not one slot each. A 429 with nothing else
  in flight says nothing about concurrency: its retry-after cools the pool down instead.
- **The provider's window.** An answer's rate-limit headers say how many requests the
  provider's window still takes (and whether tokens are left). Less the calls started
  since that answer (not counted in it yet), that is what claims may start until the
  window is whole again (`window_left` until `window_until`, the providers' reset);
  nothing left (or no tokens) cools the pool down until a call can succeed again, and
  then lets one call go, whose answer says how much room there is: the pool slows down
  before the 429, not after. A 429 saying so is not a lesson about concurrency.
- **A window learned from its 429.** Headers that count a window down with no reset (an
  OpenAI-compatible proxy's) are read as a minute's; the 429 that comes once nothing is left
  teaches the window (`pool_windows`: the headers' size per the 429's wait), and the pool is paced
  to it like one with an RPM cap (`PoolRules.learned`, held by the store that learned it).
- **Probing back up** (additive increase): `PROBE_ROUNDS x learned_limit` successes
  in a row, and at least `probe_seconds` since the limit last changed, raise it by
  one, until it reaches the configured limit and is dropped. Rare on purpose: a probe
  that finds the ceiling costs a 429.
- **Slow start.** With `PoolRules.slow_start` (the daemon's default), a claim refills a
  pool up to the most it has had in flight (`peak`, durable) and opens more only when
  all of those are busy: one slot more, or, at a group commit, one more per answer it
  records, at most `RAMP_STEP`. The claim loop then waits `RAMP_PACE_S` before its next
  claim. A 429 comes back within milliseconds while an accepted call takes its whole
  latency, so the first 429 stops the ramp after an overshoot of a step or two instead
  of a whole burst. Once the peak reaches the pool's limit this costs nothing.
- **RPM / TPM caps** (`PoolRules`): calls started in a capped pool are logged in
  `llm_pool_calls` with their token estimate (settled with the reported usage), and a
  claim admits no more than the caps allow over the last `window_s` seconds, across
  every daemon. A pool at its cap counts as full for that claim; other pools go on.
Called only from `Store` methods, inside their transactions (the claim lock held).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection

from ledger.models import LlmAttempt, LlmPool, LlmPoolCall, LlmRequest
from ledger.prices import DEFAULT_MAX_OUTPUT_TOKENS
from ledger.statuses import AttemptOutcome, RequestStatus
from ledger.store.dialect import Dialect, db_now, db_now_plus
from ledger.store.pool_windows import LearnedWindow, seed_log
from ledger.store.rows import ClaimedRequest, Completed, Outcome, PausedPool, PoolWindow, RetryLater

# A learned window is paced this much longer than the wait its 429 asked for: the provider counts a
# call when it arrives, the ledger when it starts it, so at the window's edge the ledger's log lets
# a call go a little before the provider's window has room for it (a 429 per window, without).
WINDOW_MARGIN = 0.05
# Rounds of full-limit successes before trying one more slot.
PROBE_ROUNDS = 10
# Slow start: after a claim that opened a pool's next slot, the claimer waits this long before
# claiming again, so that a refusal of that call (back within milliseconds from a nearby
# provider) is recorded before the next slot opens. 16 slots ramp in a quarter second, once.
RAMP_PACE_S = 0.015
# Slow start: the most slots one claim opens beyond the peak (one per answer that proved it).
# A pool whose peak sits at the provider's ceiling sees at most this many refusals from one
# step; the ramp still takes a few claims, not one per slot (decision 68).
RAMP_STEP = 2

pools = LlmPool.__table__  # type: ignore[attr-defined]
requests = LlmRequest.__table__  # type: ignore[attr-defined]
attempts = LlmAttempt.__table__  # type: ignore[attr-defined]
calls = LlmPoolCall.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class PoolRules:
    """What a claim enforces per pool beyond its slots (settings: LEDGER_POOL_RPM / _TPM / _SLOW_START)."""

    rpm: Mapping[str, int] = field(default_factory=dict)
    tpm: Mapping[str, int] = field(default_factory=dict)
    window_s: float = 60.0  # the "minute" (LEDGER_RATE_WINDOW_SECONDS, for tests only)
    slow_start: bool = False
    # Pools whose `rpm` counts over a window of their own: one learned from a 429 (`learned`).
    windows: Mapping[str, float] = field(default_factory=dict)
    # The requests each pool's window holds, as its answers' headers last said (`learned`).
    heard: Mapping[str, int] = field(default_factory=dict)

    @cached_property
    def rated(self) -> list[str]:
        """The pools with an RPM or TPM cap."""
        return sorted(set(self.rpm) | set(self.tpm))

    def window_of(self, endpoint: str) -> float:
        """The seconds a pool's caps count over."""
        return self.windows.get(endpoint, self.window_s)

    def by_window(self, endpoints: Iterable[str]) -> dict[float, list[str]]:
        """`endpoints` grouped by the seconds their caps count over (one group, but for learned windows)."""
        groups: dict[float, list[str]] = {}
        for ep in sorted(endpoints):
            groups.setdefault(self.window_of(ep), []).append(ep)
        return groups

    def learned(self, window: LearnedWindow) -> PoolRules:
        """These rules with a window a 429 taught (`pool_windows`): the pool is paced like one
        with that RPM over that window; a configured RPM over the usual minute, if tighter, stays.
        A window of no length is a size the headers said: kept, and the learned RPM follows it."""
        if window.seconds is None:
            heard = replace(self, heard={**self.heard, window.endpoint: window.calls})
            learned = heard.windows.get(window.endpoint)
            return heard if learned is None else heard.learned(replace(window, seconds=learned))
        configured = self.rpm.get(window.endpoint) if window.endpoint not in self.windows else None
        kept = configured is not None and configured / self.window_s <= window.calls / window.seconds
        if kept or window.endpoint in self.tpm:  # (a TPM cap counts over the minute: a pool with one keeps it)
            return self
        rpm = {**self.rpm, window.endpoint: window.calls}
        return replace(self, rpm=rpm, windows={**self.windows, window.endpoint: window.seconds})

    def capped(self, endpoint: str) -> bool:
        return endpoint in self.rpm or endpoint in self.tpm

    def spent(self, endpoint: str, calls: int, tokens: int) -> bool:
        """The pool's window holds no room for another call: its RPM or its TPM is used up."""
        return calls >= self.rpm.get(endpoint, calls + 1) or tokens >= self.tpm.get(endpoint, tokens + 1)


NO_RULES = PoolRules()

STATE = select(
    pools.c.endpoint,
    pools.c.cooldown_until > db_now(),
    pools.c.learned_limit,
    pools.c.peak,
    case((pools.c.window_until > db_now(), pools.c.window_left), else_=None),
)
_WINDOW_USE = (
    select(calls.c.endpoint, func.count(), func.coalesce(func.sum(calls.c.tokens), 0))
    .where(
        calls.c.endpoint.in_(bindparam("b_pools", expanding=True)),
        calls.c.started_at > db_now_plus(bindparam("b_since")),
    )
    .group_by(calls.c.endpoint)
)


@dataclass
class PoolRoom:
    """How much each pool may still start in this claim: slots (configured, learned, slow start)
    and its RPM / TPM window. `fits` then `take`, candidate by candidate."""

    in_flight: dict[str, int]
    pool_limit: Callable[[str], int]
    global_limit: int
    rules: PoolRules
    cooling: set[str]
    learned: dict[str, int]
    peaks: dict[str, int]
    window: dict[str, tuple[int, int]]  # rated pool -> (calls, tokens) in the window
    allowed: dict[str, int]  # pool -> calls the provider's headers still allow in its window
    proven: Mapping[str, int] = field(default_factory=dict)  # pool -> slots just freed by answers
    taken: dict[str, int] = field(default_factory=dict)
    taken_tokens: dict[str, int] = field(default_factory=dict)
    estimates: dict[int, int] = field(default_factory=dict)  # request id -> tokens reserved
    # Each pool's `limit`, worked out once per claim: it is asked for every candidate (issue 9).
    # Sound because `_limit` reads only what `read` fixed, never what the claim takes.
    limits: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def read(
        cls,
        conn: Connection,
        state_rows: Iterable[Any],
        in_flight: dict[str, int],
        pool_limit: Callable[[str], int],
        global_limit: int,
        rules: PoolRules,
        proven: Mapping[str, int] | None = None,
        hold: Collection[str] = (),
    ) -> PoolRoom:
        """`state_rows`: what `STATE` read. `hold`: pools with a 429 on its way to the ledger, whose
        lesson is not written yet: this claim treats them as cooling down and opens nothing in them."""
        state = read_state(conn, state_rows, pool_limit)
        window: dict[str, tuple[int, int]] = {}
        for seconds, rated in rules.by_window(rules.rated).items():
            params = {"b_pools": rated, "b_since": -seconds}
            window |= {ep: (int(n), int(t)) for ep, n, t in conn.execute(_WINDOW_USE, params)}
        return cls(
            in_flight,
            pool_limit,
            global_limit,
            rules,
            state.cooling | set(hold),
            state.learned,
            state.peaks,
            window,
            state.allowed,
            proven or {},
        )

    def fresh(self) -> PoolRoom:
        """The same room with nothing taken yet (a claim that picks again from other candidates)."""
        return replace(self, taken={}, taken_tokens={}, estimates={})

    def limit(self, endpoint: str) -> int:
        """The pool's slots: configured, lowered by what it learned, opened a few at a time in slow start."""
        known = self.limits.get(endpoint)
        if known is None:
            known = self.limits[endpoint] = self._limit(endpoint)
        return known

    def _limit(self, endpoint: str) -> int:
        limit = min(self.pool_limit(endpoint), self.learned.get(endpoint, self.global_limit))
        peak = self.peaks.get(endpoint, 0)
        if self.rules.slow_start and peak < limit:
            # Refill up to the peak; more only when every slot up to it is busy (then it is proven):
            # in flight now, or until this group's answers freed them. One more per answer, at
            # least one and at most RAMP_STEP: answers come back a call's latency apart, a
            # refusal within milliseconds, so a step past the provider's ceiling costs that many.
            answered = self.proven.get(endpoint, 0)
            busy = self.in_flight.get(endpoint, 0) + answered
            return min(limit, peak + min(max(1, answered), RAMP_STEP) if busy >= peak else peak)
        return limit

    @property
    def full(self) -> list[str]:
        """Pools this claim need not read candidates of: no slot, cooling, or their window is spent."""
        full = {ep for ep, n in self.in_flight.items() if n >= self.limit(ep)} | self.cooling
        full |= {ep for ep, left in self.allowed.items() if left <= 0}
        for ep in self.rules.rated:
            n, tokens = self.window.get(ep, (0, 0))
            if self.rules.spent(ep, n, tokens):
                full.add(ep)
        return sorted(full)

    def fits(self, endpoint: str, token_estimate: int | None) -> bool:
        used = self.in_flight.get(endpoint, 0) + self.taken.get(endpoint, 0)
        if used >= self.limit(endpoint) or self.taken.get(endpoint, 0) >= self.allowed.get(endpoint, used + 1):
            return False
        if not self.rules.capped(endpoint):
            return True
        n, tokens = self.window.get(endpoint, (0, 0))
        n += self.taken.get(endpoint, 0)
        tokens += self.taken_tokens.get(endpoint, 0)
        if n >= self.rules.rpm.get(endpoint, n + 1):
            return False
        tpm = self.rules.tpm.get(endpoint)
        # A call bigger than the whole cap still runs, alone in an empty window.
        return tpm is None or tokens == 0 or tokens + _tokens(token_estimate) <= tpm

    def take(self, request_id: int, endpoint: str, token_estimate: int | None) -> None:
        self.taken[endpoint] = self.taken.get(endpoint, 0) + 1
        if self.rules.capped(endpoint):
            self.taken_tokens[endpoint] = self.taken_tokens.get(endpoint, 0) + _tokens(token_estimate)
            self.estimates[request_id] = _tokens(token_estimate)

    def started(self, conn: Connection, dialect: Dialect, claimed: list[ClaimedRequest]) -> bool:
        """After the claim's UPDATE: raise the peaks of pools that grew, log calls in capped pools.
        True when a pool in slow start grew (the claimer paces its next claim)."""
        grew = False
        if self.rules.slow_start:
            for ep, n in sorted(self.taken.items()):
                now = self.in_flight.get(ep, 0) + n
                if now > self.peaks.get(ep, 0):
                    grew = True
                    grown = case((pools.c.peak < now, now), else_=pools.c.peak)
                    first = {"endpoint": ep, "peak": now}
                    conn.execute(dialect.upsert(pools, ["endpoint"], first, {}, on_conflict={"peak": grown}))
        for ep in sorted(set(self.taken) & set(self.allowed)):
            conn.execute(
                update(pools).where(pools.c.endpoint == ep).values(window_left=pools.c.window_left - self.taken[ep])
            )
        logged = [r for r in claimed if r.id in self.estimates]
        if logged:
            log_calls(conn, [(r.endpoint, r.id, r.attempt, self.estimates[r.id]) for r in logged], self.rules)
        return grew


def _tokens(estimate: int | None) -> int:
    return DEFAULT_MAX_OUTPUT_TOKENS if estimate is None else int(estimate)


def log_calls(conn: Connection, started: list[tuple[str, int, int, int]], rules: PoolRules) -> None:
    """Calls started in capped pools (endpoint, request id, attempt, tokens); what left the window goes."""
    conn.execute(
        insert(calls).values(started_at=db_now()),
        [{"endpoint": ep, "request_id": rid, "attempt": n, "tokens": t} for ep, rid, n, t in started],
    )
    for seconds, endpoints in rules.by_window({s[0] for s in started}).items():
        conn.execute(delete(calls).where(calls.c.endpoint.in_(endpoints), calls.c.started_at < db_now_plus(-seconds)))


def held_call_started(conn: Connection, request: ClaimedRequest, attempt: int, rules: PoolRules) -> None:
    """A retry that held its slot through the back-off calls again: it counts in a capped pool's window."""
    if rules.capped(request.endpoint):
        estimate = conn.execute(select(requests.c.token_estimate).where(requests.c.id == request.id)).scalar()
        log_calls(conn, [(request.endpoint, request.id, attempt, _tokens(estimate))], rules)


def window_full(conn: Connection, endpoint: str, rules: PoolRules) -> bool:
    """A capped pool with no call left in its window (a held retry must not start one)."""
    if not rules.capped(endpoint):
        return False
    params = {"b_pools": [endpoint], "b_since": -rules.window_of(endpoint)}
    row = conn.execute(_WINDOW_USE, params).first()
    n, tokens = (int(row[1]), int(row[2])) if row else (0, 0)
    return rules.spent(endpoint, n, tokens)


@dataclass
class PoolState:
    """`llm_pools` as a claim reads it."""

    cooling: set[str] = field(default_factory=set)
    learned: dict[str, int] = field(default_factory=dict)  # effective learned limits
    peaks: dict[str, int] = field(default_factory=dict)
    allowed: dict[str, int] = field(default_factory=dict)  # calls the provider's window still allows


def read_state(conn: Connection, rows: Iterable[Any], configured: Callable[[str], int]) -> PoolState:
    """Every pool's state from `STATE`'s rows; learned limits that grew back to the configured
    limit are dropped."""
    state = PoolState()
    recovered: list[str] = []
    for endpoint, is_cooling, limit, peak, allowed in rows:
        state.peaks[endpoint] = int(peak)
        if is_cooling:
            state.cooling.add(endpoint)
        if allowed is not None:
            state.allowed[endpoint] = int(allowed)
        if limit is not None:
            if limit >= configured(endpoint):
                recovered.append(endpoint)
            else:
                state.learned[endpoint] = int(limit)
    if recovered:
        conn.execute(update(pools).where(pools.c.endpoint.in_(recovered)).values(learned_limit=None, successes=0))
    return state


# -- what answers teach ----------------------------------------------------------------


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


# Pools paused now: nothing of theirs is claimed (their cooldown) until the pause ends.
PAUSED_POOLS = select(pools.c.endpoint).where(pools.c.paused_reason.is_not(None), pools.c.cooldown_until > db_now())


def pause_pools(conn: Connection, dialect: Dialect, outcomes: Iterable[Outcome]) -> list[PausedPool]:
    """Pause the pools whose account's quota or balance a group's outcomes say is spent: no daemon
    claims them until the pause ends (their cooldown), then one request probes (learned limit 1)
    and its answer ends the pause (`note_successes`) or a refusal starts another. Returns the
    pools that were not paused before: each pause is announced once, not once per request."""
    asked: dict[str, tuple[str, RetryLater]] = {}
    for o in outcomes:
        if isinstance(o, RetryLater) and o.pause is not None:
            asked.setdefault(o.request.endpoint, (o.pause.reason, o))
    paused = []
    for endpoint, (reason, o) in sorted(asked.items()):
        was = conn.execute(select(pools.c.endpoint).where(pools.c.endpoint == endpoint, *_PAUSED_NOW)).first()
        assert o.pause is not None
        until = db_now_plus(o.pause.seconds)
        later = case((pools.c.cooldown_until > until, pools.c.cooldown_until), else_=until)
        values = {"paused_reason": reason[:300], "learned_limit": 1, "successes": 0, "updated_at": db_now()}
        first = {"endpoint": endpoint, "cooldown_until": until}
        conn.execute(dialect.upsert(pools, ["endpoint"], first, values, on_conflict={"cooldown_until": later}))
        if was is None:
            ends = conn.execute(select(pools.c.cooldown_until).where(pools.c.endpoint == endpoint)).scalar_one()
            paused.append(PausedPool(endpoint, o.request.provider, reason, ends))
    return paused


_PAUSED_NOW = (pools.c.paused_reason.is_not(None), pools.c.cooldown_until > db_now())


def resume_pool(conn: Connection, endpoint: str) -> bool:
    """Lift a pool's pause at once (`ledger pools resume`); False when it was not paused."""
    return bool(
        conn.execute(
            update(pools)
            .where(pools.c.endpoint == endpoint, pools.c.paused_reason.is_not(None))
            .values(paused_reason=None, cooldown_until=None, learned_limit=None, successes=0, updated_at=db_now())
        ).rowcount
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
