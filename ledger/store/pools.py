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
Here: what a claim may start (`PoolRoom`, slow start included). What answers teach (the
window, learned limits, cooldowns, probing back up): `pool_lessons.py`; windows learned from
a 429: `pool_windows.py`; the RPM / TPM caps and their call log: `pool_rates.py`; a spent
quota's pause: `pool_pauses.py`.
Called only from `Store` methods, inside their transactions (the pools' turns held).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, select, update
from sqlalchemy.engine import Connection

from ledger.models import LlmPool
from ledger.store.dialect import Dialect, db_now

# What answers teach, pauses and RPM / TPM caps live in their own modules; the store's modules
# reach them through this one (`from ledger.store import pools as pool_state`), the pools' one name.
from ledger.store.pool_lessons import (
    note_outcomes as note_outcomes,
)
from ledger.store.pool_lessons import (
    note_successes as note_successes,
)
from ledger.store.pool_lessons import (
    over_learned_limit as over_learned_limit,
)
from ledger.store.pool_lessons import (
    quiet as quiet,
)
from ledger.store.pool_pauses import (
    PAUSED_POOLS as PAUSED_POOLS,
)
from ledger.store.pool_pauses import (
    pause_pools as pause_pools,
)
from ledger.store.pool_pauses import (
    resume_pool as resume_pool,
)
from ledger.store.pool_rates import (
    NO_RULES as NO_RULES,
)
from ledger.store.pool_rates import (
    WINDOW_USE,
    log_calls,
    reserved_tokens,
)
from ledger.store.pool_rates import (
    PoolRules as PoolRules,
)
from ledger.store.pool_rates import (
    held_call_started as held_call_started,
)
from ledger.store.pool_rates import (
    window_full as window_full,
)
from ledger.store.rows import ClaimedRequest

# Slow start: after a claim that opened a pool's next slot, the claimer waits this long before
# claiming again, so that a refusal of that call (back within milliseconds from a nearby
# provider) is recorded before the next slot opens. 16 slots ramp in a quarter second, once.
RAMP_PACE_S = 0.015
# Slow start: the most slots one claim opens beyond the peak (one per answer that proved it).
# A pool whose peak sits at the provider's ceiling sees at most this many refusals from one
# step; the ramp still takes a few claims, not one per slot (decision 68).
RAMP_STEP = 2

pools = LlmPool.__table__  # type: ignore[attr-defined]


STATE = select(
    pools.c.endpoint,
    pools.c.cooldown_until > db_now(),
    pools.c.learned_limit,
    pools.c.peak,
    case((pools.c.window_until > db_now(), pools.c.window_left), else_=None),
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
    turns: frozenset[str] = frozenset()  # pools the claim may take from (their turn or slots held)
    # Slotted pools (PostgreSQL, no turn): how many of its slots the claim locked, the most it takes.
    slot_caps: dict[str, int] = field(default_factory=dict)
    taken: dict[str, int] = field(default_factory=dict)
    taken_tokens: dict[str, int] = field(default_factory=dict)
    estimates: dict[int, int] = field(default_factory=dict)  # request id -> tokens reserved
    # Each pool's `limit`, worked out once per claim: it is asked for every candidate.
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
        turns: Collection[str] = (),
    ) -> PoolRoom:
        """`state_rows`: what `STATE` read. `hold`: pools with a 429 on its way to the ledger, whose
        lesson is not written yet: this claim treats them as cooling down and opens nothing in them.
        `turns`: the pools this claim may take from (their turn held, or their own slots)."""
        state = read_state(conn, state_rows, pool_limit)
        window: dict[str, tuple[int, int]] = {}
        for seconds, rated in rules.by_window(rules.rated).items():
            params = {"b_pools": rated, "b_since": -seconds}
            window |= {ep: (int(n), int(t)) for ep, n, t in conn.execute(WINDOW_USE, params)}
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
            frozenset(turns),
        )

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
        if self.taken.get(endpoint, 0) >= self.slot_caps.get(endpoint, self.taken.get(endpoint, 0) + 1):
            return False
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
        return tpm is None or tokens == 0 or tokens + reserved_tokens(token_estimate) <= tpm

    def take(self, request_id: int, endpoint: str, token_estimate: int | None) -> None:
        self.taken[endpoint] = self.taken.get(endpoint, 0) + 1
        if self.rules.capped(endpoint):
            self.taken_tokens[endpoint] = self.taken_tokens.get(endpoint, 0) + reserved_tokens(token_estimate)
            self.estimates[request_id] = reserved_tokens(token_estimate)

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


@dataclass
class PoolState:
    """`llm_pools` as a claim reads it."""

    cooling: set[str] = field(default_factory=set)
    learned: dict[str, int] = field(default_factory=dict)  # effective learned limits
    peaks: dict[str, int] = field(default_factory=dict)
    allowed: dict[str, int] = field(default_factory=dict)  # calls the provider's window still allows


def read_state(conn: Connection, rows: Iterable[Any], configured: Callable[[str], int]) -> PoolState:
    """Every pool's state from `STATE`'s rows; learned limits that grew back to the configured
    limit are dropped (rows another transaction is writing are left for a later claim: a claim
    holding turns never waits for a pool's row)."""
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
    if recovered:  # each row locked as found, skipping one another transaction writes: never waited for
        locked = select(pools.c.endpoint).where(pools.c.endpoint.in_(recovered)).with_for_update(skip_locked=True)
        conn.execute(
            update(pools).where(pools.c.endpoint.in_(locked.scalar_subquery())).values(learned_limit=None, successes=0)
        )
    return state
