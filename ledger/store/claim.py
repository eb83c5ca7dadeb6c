"""The claim's SQL: a `running` row is an occupied slot; leases keep it, expiry frees it.

Invariants every statement here keeps:
- The claim counts `running` rows of a pool *after* taking that pool's turn, and takes the
  global limit's slots one by one (PostgreSQL; SQLite's one writer counts the total), so no
  number of daemon processes can overshoot a limit (docs/architecture.md).
- A claim increments the request's attempt counter and inserts the attempt row
  in the same transaction, before any call: a crash resumes at the right attempt.
- Times are the database's (`db_now`), never the process's.

The statements are built once, at import, with bound parameters: the claim runs
once per freed slot, and building SQLAlchemy constructs per call cost more than
the database's own work.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    String,
    bindparam,
    column,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.engine import Connection, Engine

from ledger.statuses import AttemptOutcome, Delivery
from ledger.store import pools as pool_state
from ledger.store import slots as slot_sql
from ledger.store.budget import Budget
from ledger.store.cache import sweep_twins
from ledger.store.commit import transaction
from ledger.store.dialect import (
    JOB,
    POOL,
    Dialect,
    Ran,
    db_now,
    db_now_plus,
    unindexed,
)
from ledger.store.lease_ends import CLAIMED_COLUMNS, Held, LeaseQueries, extend_leases, reclaim_expired, to_claimed
from ledger.store.lease_ends import QUEUED as QUEUED
from ledger.store.lease_ends import RUNNING as RUNNING
from ledger.store.pool_overrides import READ_OVERRIDES, overrides_from
from ledger.store.row_sets import bound_rows
from ledger.store.rows import NOTHING_RELEASED, Claim, ClaimedRequest, ReleasedRows
from ledger.store.tables import attempts, requests, workers

# How many candidates to read per free slot: some may belong to pools that fill up.
_CANDIDATES_PER_SLOT = 4
# Candidates a group commit reads ahead beyond the slots its group frees. Four per slot, as
# a claim of its own reads, cost each request three rows read and dropped (a twentieth of
# the lane's time on SQLite): one pool is the usual case, and a claim whose read
# ahead fell short (a full pool's rows crowding the others) reads again (`claim_in`).
_READ_AHEAD_SPARE = 8
_c = requests.c
# Pseudo pool keys for the claim's bookkeeping rows; real keys always contain ':'.
_LIVE_WORKERS, _MINE = "@workers", "@mine"
# One round trip for the counts a claim needs: slots in use per pool, live daemons, and
# this daemon's own slots.
_CLAIM_STATE = union_all(
    select(_c.endpoint, func.count()).where(_c.status == RUNNING).group_by(_c.endpoint),
    select(literal(_LIVE_WORKERS), func.count()).where(workers.c.heartbeat_at > db_now_plus(bindparam("b_since"))),
    select(literal(_MINE), func.count()).where(_c.status == RUNNING, _c.lease_owner == bindparam("b_worker")),
)
_FULL = bound_rows("f", "b_full", column("endpoint", String))
# Due rows in claim order, leaving out full and cooling pools (an empty list leaves out none).
_CANDIDATES = (
    select(_c.id, _c.endpoint, _c.job_id, _c.estimate_usd, _c.token_estimate)
    .where(
        _c.status == QUEUED,
        _c.delivery == Delivery.ONLINE.value,
        _c.next_attempt_at <= db_now(),
        _c.twin_of.is_(None),  # a twin waits for its original's answer (`ledger.store.cache`)
        _c.endpoint.not_in(select(_FULL.c.endpoint)),
    )
    .order_by(_c.priority.desc(), _c.fair_seq, _c.id)
    .limit(bindparam("b_limit"))
)
# The rows a claim picked, as a table (`bound_rows`): the take and its attempt rows run
# as hot statements (`Dialect.execute`), compiled once, where an expanding IN list would have
# SQLAlchemy render the statement anew at every claim (a sixth of the lane's GIL time).
_PICKED = bound_rows("t", "b_ids", column("id", BigInteger), keys="b_id_list")
_TAKE = (
    update(requests)
    .where(_PICKED.match(_c.id), unindexed(_c.status) == QUEUED)
    .values(
        status=RUNNING,
        lease_owner=bindparam("b_worker"),
        lease_token=_c.lease_token + 1,
        lease_expires_at=db_now_plus(bindparam("b_lease")),
        attempts=_c.attempts + 1,
        reserved_usd=_c.estimate_usd,
        updated_at=db_now(),
    )
    .returning(*CLAIMED_COLUMNS)
)
START_ATTEMPT = insert(attempts).values(started_at=db_now())
# The take and its attempt rows in one statement, where the database can (PostgreSQL: a
# data-modifying CTE), saving the claim a round trip.
_taken = _TAKE.cte("taken")
RUNNING_ATTEMPT = AttemptOutcome.RUNNING.value
_TAKE_AND_START = select(*(_taken.c[col.name] for col in CLAIMED_COLUMNS)).add_cte(
    insert(attempts)
    .from_select(
        ["request_id", "attempt", "worker", "outcome", "started_at"],
        select(_taken.c.id, _taken.c.attempts, bindparam("b_worker"), literal(RUNNING_ATTEMPT), db_now()),
    )
    .cte("started")
)
# SQLite's second half of `_TAKE_AND_START`: the attempt rows of the rows just taken, as one
# statement (an executemany would be a step per row, each a GIL round trip to the event loop).
_TAKEN = bound_rows("t", "b_taken", column("id", BigInteger))
_START_TAKEN = insert(attempts).from_select(
    ["request_id", "attempt", "worker", "outcome", "started_at"],
    select(_c.id, _c.attempts, bindparam("b_worker"), literal(RUNNING_ATTEMPT), db_now()).where(_c.id == _TAKEN.c.id),
)
# `_TAKE_AND_START` with the slots its rows take (PostgreSQL: `slots.py`).
_TAKE_START_AND_HOLD = _TAKE_AND_START.add_cte(slot_sql.hold(_taken))


@dataclass(frozen=True)
class SlotsAsked:
    """The slots a group commit's first round trip locked ahead (PostgreSQL): up to `global_want`
    of the global limit's, and per pool (slots made, want) up to `want` numbered up to those made."""

    global_want: int
    pools: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class ClaimReads:
    """A claim's reads, to be sent ahead with other statements (`ClaimQueries.claim_reads`), and,
    once run, what they `found`: slots in use, pool state, limits changed live, candidates and,
    with `slots`, the free slots locked ahead."""

    statements: list[tuple[Any, dict[str, Any]]]
    candidates_asked: int
    found: list[Ran] = field(default_factory=list)
    slots: SlotsAsked | None = None


@dataclass(frozen=True)
class _Limits:
    """What a claim was asked to keep to, as `_claim_pools` needs it."""

    worker: str
    lease_seconds: float
    global_limit: int
    max_claims: int
    pool_limit: Callable[[str], int]
    rules: pool_state.PoolRules
    proven: Mapping[str, int] | None
    hold: Collection[str]
    daily_budget: float | None


@dataclass(frozen=True)
class _Counts:
    """`_CLAIM_STATE` as read: slots in use per pool and in total, and what the claim may take:
    its free slots, its daemon's fair share of the global limit and `max_claims` (the least)."""

    in_flight: dict[str, int]
    total: int
    free: int

    @classmethod
    def read(cls, rows: Any, global_limit: int, max_claims: int) -> _Counts:
        in_flight: dict[str, int] = {}
        state = {_LIVE_WORKERS: 0, _MINE: 0}
        for endpoint, n in rows:
            if endpoint in state:
                state[endpoint] = n
            else:
                in_flight[endpoint] = n
        total = sum(in_flight.values())
        # Several daemons share the global limit fairly: each holds at most its share.
        share = -(-global_limit // max(state[_LIVE_WORKERS], 1))
        return cls(in_flight, total, min(global_limit - total, max_claims, share - state[_MINE]))


@dataclass(frozen=True)
class _Picked:
    """What a claim picked: request ids in claim order, the slots locked for them (PostgreSQL),
    and the candidates they came from (each one's pool, for its slots)."""

    ids: list[int]
    grabbed: slot_sql.Grabbed | None
    candidates: list[Any]


def _reclaim(
    conn: Connection, dialect: Dialect, worker: str, lease_seconds: float, held: Collection[Held], max_attempts: int
) -> list[ClaimedRequest]:
    """What a claim does first: renew the leases its worker is still working on (a live claimer
    never reclaims those, however late its renewal: a database outage longer than the lease),
    end the expired ones, and settle twins whose original ended unseen by the writes that end
    originals. Returns the rows whose leases it ended."""
    extend_leases(conn, worker, lease_seconds, held)
    reclaimed = reclaim_expired(conn, dialect, max_attempts)
    sweep_twins(conn)
    return reclaimed


def _closed(room: pool_state.PoolRoom, candidates: list[Any]) -> set[str]:
    """The pools of `candidates` that `room` leaves no call to: full, cooling, their window spent."""
    ends = {r.endpoint for r in candidates}
    return set(room.full) | {ep for ep in ends if room.in_flight.get(ep, 0) >= room.limit(ep) or ep in room.cooling}


def _candidates_for(slots: int) -> int:
    """How many candidates to read for `slots` free slots: some may belong to pools that fill up."""
    return max(slots, 1) * _CANDIDATES_PER_SLOT


class ClaimQueries(LeaseQueries):
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect
    # Each set in Store's constructor, one per store (never shared between stores):
    # pools with a learned limit as of this store's last claim: only their successes are counted;
    learning: set[str]
    # pools held to what the provider's headers allowed, as of this store's last claim;
    windowed: set[str]
    # how long a learned limit stands before one more slot is tried (LEDGER_POOL_PROBE_SECONDS);
    pool_probe_seconds: float
    # RPM/TPM caps and slow start (LEDGER_POOL_RPM, _TPM, _SLOW_START).
    pool_rules: pool_state.PoolRules
    # Job id -> its own budget (None: none): fixed when the job is staged, so looked up once (Store sets it).
    job_caps: dict[str, float | None]

    # Slots made in llm_slots, as far as this store knows (PostgreSQL: `make_slots`): the global
    # limit's, and per slotted pool (`_claim_pools`).
    slots_made: int = 0
    pool_slots_made: dict[str, int]
    # This store's last claim's candidates per pool: the pools a group commit locks slots of ahead.
    candidate_pools: Mapping[str, int] = MappingProxyType({})

    @cached_property
    def _candidates(self) -> Select[Any]:
        return self.dialect.for_update(_CANDIDATES)

    def claim(self, worker: str, **limits: Any) -> Claim:
        """Take as many due requests as free slots allow, in one transaction (see `claim_in`)."""
        self.make_slots(limits["global_limit"])
        with transaction(self.engine, self.dialect) as conn:
            self.dialect.writer_turn(conn, worker, alone=limits.get("daily_budget") is not None)
            return self.claim_in(conn, worker, **limits)

    def make_slots(self, global_limit: int, pools: Mapping[str, int] | None = None) -> None:
        """PostgreSQL: the global limit's slots numbered 1..`global_limit` exist, and each of `pools`'
        1..its limit. Made once per process, in a transaction of their own, committed at once:
        never inside a claim, where an insert could wait behind another claim's new slots."""
        new = {p: n for p, n in (pools or {}).items() if self.pool_slots_made.get(p, 0) < n}
        if global_limit > self.slots_made:
            new[slot_sql.GLOBAL] = global_limit
        if self.dialect.keeps_slots and new:
            with transaction(self.engine, self.dialect, rerunnable=True) as conn:
                rows = [{"pool": p, "lim": n} for p, n in sorted(new.items())]
                conn.execute(slot_sql.MAKE_SLOTS, {"b_pools": slot_sql.pools_json(rows)})
            self.slots_made = max(self.slots_made, global_limit)
            self.pool_slots_made.update({p: n for p, n in new.items() if p != slot_sql.GLOBAL})

    def claim_reads(
        self,
        worker: str,
        lease_seconds: float,
        expected: int,
        global_limit: int = 0,
        freed_in: Collection[str] = (),
    ) -> ClaimReads:
        """The claim's reads (slots in use, pool state, due candidates for about `expected` free
        slots), for a caller to send with its own statements: a group commit sends them with the
        group's writes, one round trip on PostgreSQL. Its claim (`claim_in(read=...)`) reads
        more candidates only if these were too few, or crowded out by a full pool's.

        PostgreSQL, with `global_limit`: the free slots too, `expected` global ones and, of each
        pool its candidates are likely to be in, as many (the pools of `freed_in`, whose slots the
        group frees) or as many as it had candidates at this store's last claim, up to that,
        for pools that took no turn then and whose slots it made. Read after the group's writes
        (which free its own slots). The claim uses them when they are as many as it would have
        locked itself (`_claim_ahead`), and skips the round trip that would lock them."""
        asked = max(expected, 1) + _READ_AHEAD_SPARE
        reads = [*self._state_reads(worker, lease_seconds), self._candidate_read((), asked)]
        if not (self.dialect.keeps_slots and global_limit):
            return ClaimReads(reads, asked)
        likely = {p: expected for p in freed_in} | {
            p: min(n, expected) for p, n in self.candidate_pools.items() if p not in freed_in
        }
        pools = {
            p: (self.pool_slots_made[p], n)
            for p, n in sorted(likely.items())
            if p in self.pool_slots_made and not self.pool_rules.capped(p) and p not in self.windowed
        }
        wanted = [{"pool": p, "lim": made, "want": n} for p, (made, n) in pools.items()]
        reads += slot_sql.grab(global_limit, expected, wanted)
        return ClaimReads(reads, asked, slots=SlotsAsked(expected, pools))

    def _state_reads(self, worker: str, lease_seconds: float) -> list[tuple[Any, dict[str, Any]]]:
        return [
            (_CLAIM_STATE, {"b_since": -lease_seconds, "b_worker": worker}),
            (pool_state.STATE, {}),
            (READ_OVERRIDES, {}),  # limits changed live (`ledger pools set`)
        ]

    def _candidate_read(self, full: Collection[str], limit: int) -> tuple[Any, dict[str, Any]]:
        return self._candidates, {**_FULL.bind({"endpoint": e} for e in full), "b_limit": limit}

    def claim_in(
        self,
        conn: Connection,
        worker: str,
        *,
        lease_seconds: float,
        global_limit: int,
        pool_limit: Callable[[str], int],
        max_attempts: int,
        max_claims: int,
        daily_budget: float | None = None,
        reclaim: bool = True,
        held: Collection[Held] = (),
        proven: Mapping[str, int] | None = None,
        hold: Collection[str] = (),
        read: ClaimReads | None = None,
    ) -> Claim:
        """The claim, inside a transaction that holds the writer's turn (`Dialect.writer_turn`; the
        ledger's turn alone under a daily budget). `proven`: per pool, the slots an outcome just
        freed with an answer (a group commit's own claim); `hold`: pools this claim leaves alone (a
        refusal from them is on its way to the ledger); `read`: `claim_reads` with what it found,
        read in this transaction after its last write.

        What was read before the pools' turns is a view only: it names the pools to take turns
        for. Their running rows, state and windows are read again once their turns are held
        (`_claim_pools`), and only those counts decide; the global limit is the slots taken."""
        reclaimed_rows = _reclaim(conn, self.dialect, worker, lease_seconds, held, max_attempts) if reclaim else []
        reclaim_ts = time.time()
        counts, state_rows, override_rows = (
            self.dialect.run_all(conn, self._state_reads(worker, lease_seconds)) if read is None else read.found[:3]
        )
        seen = _Counts.read(counts, global_limit, max_claims)
        reclaimed = ReleasedRows(reclaimed_rows, seen.total, reclaim_ts) if reclaimed_rows else NOTHING_RELEASED
        if seen.free <= 0:
            return Claim([], seen.total, reclaimed)
        # Per pool: slots (configured, learned, slow start), cooldown, RPM/TPM window (pools.py);
        # limits changed live (`ledger pools set`) over the settings.
        rules, changed = self.pool_rules, overrides_from(override_rows)
        if changed is not None:
            pool_limit, rules = changed.applied(pool_limit, rules, global_limit)
        limits = _Limits(worker, lease_seconds, global_limit, max_claims, pool_limit, rules, proven, hold, daily_budget)
        view = pool_state.PoolRoom.read(conn, state_rows, seen.in_flight, pool_limit, global_limit, rules, proven, hold)
        seen, room, picked = self._pick_in_pools(conn, limits, seen, view, read)
        self.candidate_pools = Counter(r.endpoint for r in picked.candidates)
        self.learning, self.windowed = set(room.learned), set(room.allowed)
        if not picked.ids:
            return Claim([], seen.total, reclaimed)
        leased_at = time.monotonic()
        claimed = self._take(conn, limits, picked)
        ramping = room.started(conn, self.dialect, claimed)
        return Claim(claimed, seen.total + len(claimed), reclaimed, leased_at, ramping)

    def _pick_in_pools(
        self, conn: Connection, limits: _Limits, seen: _Counts, view: pool_state.PoolRoom, read: ClaimReads | None
    ) -> tuple[_Counts, pool_state.PoolRoom, _Picked]:
        """Candidates read (those `read` found, else read now), their pools locked and counted
        (`_claim_pools`, or with the slots `read` locked: `_claim_ahead`), and the rows those
        allow picked; read once more, past the pools that had no room, when too few were picked
        from a full read."""
        candidates = read.found[3].rows if read is not None else None
        asked = read.candidates_asked if read is not None else 0
        full, room = view.full, view
        grabbed: slot_sql.Grabbed | None
        for last in (False, True):
            ahead = None
            if candidates is None:
                asked = _candidates_for(seen.free)
                (found,) = self.dialect.run_all(conn, [self._candidate_read(full, asked)])
                candidates = found.rows
            elif read is not None:  # the slots locked with the reads, if they are enough
                ahead = self._claim_ahead(conn, limits, candidates, seen, view, read)
            if ahead is None:
                closed = _closed(room, candidates)  # no turn taken for a pool with no room left
                seen, room, ids, grabbed = self._claim_pools(conn, limits, candidates, closed, seen.free, room)
            else:
                room, ids, grabbed = ahead
            if len(ids) >= seen.free or len(candidates) < asked or last:
                break
            # Too few: more rows were due, and a full pool's (or the budget's, or a pool whose
            # turn another claim held) may have crowded the others out. Read again, past those.
            full, candidates = sorted(_closed(room, candidates) | {r.endpoint for r in candidates} - room.turns), None
        return seen, room, _Picked(ids, grabbed, candidates or [])

    def _take(self, conn: Connection, limits: _Limits, picked: _Picked) -> list[ClaimedRequest]:
        """Start the picked rows under the worker's lease, each with its attempt row (and, on
        PostgreSQL, the slots locked for it), in the order they were picked."""
        params = {
            **_PICKED.bind({"id": i} for i in picked.ids),
            "b_worker": limits.worker,
            "b_lease": limits.lease_seconds,
        }
        together = _TAKE_AND_START
        if picked.grabbed is not None:  # each row taken holds slots locked for it
            together = _TAKE_START_AND_HOLD
            endpoint_of = {row.id: row.endpoint for row in picked.candidates}
            params |= slot_sql.HOLD.bind(picked.grabbed.pairs([(i, endpoint_of[i]) for i in picked.ids]))
        took = self.dialect.update_then_insert(
            conn,
            together,
            (_TAKE, params),
            lambda rows: (_START_TAKEN, {**_TAKEN.bind({"id": r.id} for r in rows), "b_worker": limits.worker}),
        )
        order = {request_id: i for i, request_id in enumerate(picked.ids)}
        return sorted((to_claimed(r) for r in took), key=lambda r: order[r.id])

    def _claim_ahead(
        self,
        conn: Connection,
        limits: _Limits,
        candidates: list[Any],
        seen: _Counts,
        view: pool_state.PoolRoom,
        read: ClaimReads,
    ) -> tuple[pool_state.PoolRoom, list[int], slot_sql.Grabbed] | None:
        """`_claim_pools` with the slots the group commit locked ahead (`claim_reads`), and the
        counts and pool state read in the same round trip, after the group's writes: no
        statement more before the take. None (the caller takes `_claim_pools`' path, one round
        trip more) when a candidate's pool takes its turn (its window is counted under it), or
        fewer slots were asked for than `_claim_pools` would lock: more free slots than the
        group freed, a pool the group freed none of, a pool's slots not made up to its limit.
        Caps hold as on that path: each row taken holds a global slot this transaction locked
        while it was free, numbered up to the global limit, and one of its pool's, numbered up
        to the limit this claim read (slots locked above it are left)."""
        asked = read.slots
        pools = sorted({r.endpoint for r in candidates} - set(_closed(view, candidates)) - set(limits.hold))
        if asked is None or any(limits.rules.capped(p) or p in view.allowed for p in pools):
            return None
        due = [r for r in candidates if r.endpoint in pools]
        if asked.global_want < min(seen.free, len(due)):
            return None
        locked = slot_sql.Grabbed.read(read.found[4].rows, read.found[5].rows)
        kept: dict[str, list[int]] = {}
        for p in pools:
            made, want = asked.pools.get(p, (0, 0))
            if made < min(limits.pool_limit(p), limits.global_limit):
                return None
            lim = min(view.limit(p), limits.pool_limit(p), limits.global_limit)
            space = max(lim - view.in_flight.get(p, 0), 0)
            if want < min(sum(1 for r in due if r.endpoint == p), seen.free, space):
                return None
            kept[p] = [n for n in locked.pools.get(p, []) if n <= lim]
        grabbed = slot_sql.Grabbed(locked.global_nos, kept)
        view.turns = frozenset(pools)
        view.slot_caps = {p: len(nos) for p, nos in kept.items()}
        room_left = min(seen.free, len(grabbed.global_nos))
        picked = self._pick(conn, due, view, room_left, limits.daily_budget) if room_left > 0 else []
        return view, picked, grabbed

    def _claim_pools(
        self,
        conn: Connection,
        limits: _Limits,
        candidates: list[Any],
        full: Collection[str],
        free: int,
        view: pool_state.PoolRoom,
    ) -> tuple[_Counts, pool_state.PoolRoom, list[int], slot_sql.Grabbed | None]:
        """Lock what the candidates' pools (those with room in `view`) need, read them again, and
        pick what the counts, slots and budgets allow. A pool with an RPM / TPM cap or a provider's
        window takes its turn (its window is counted exactly under it; SQLite: every pool, its
        one writer holds every turn); on PostgreSQL every other pool takes its own slots instead,
        and every request a global slot (`slots.py`), none waited for. Returns the counts read,
        the room, the ids picked and, on PostgreSQL, the slots locked for them. `free`: the free
        slots the view saw, the most global slots locked (others' claims skip those held here)."""
        pools = sorted({r.endpoint for r in candidates} - set(full) - set(limits.hold))
        keeps = self.dialect.keeps_slots
        turned = [p for p in pools if not keeps or limits.rules.capped(p) or p in view.allowed]
        slotted = [p for p in pools if p not in turned]
        reads = self._state_reads(limits.worker, limits.lease_seconds)
        if keeps:
            reads += self._slot_reads(limits, candidates, pools, slotted, free, view)
        turns, ran = self.dialect.take_turns(conn, [(POOL, p) for p in turned], *reads)
        mine = {name for _, name in turns} | set(slotted)  # the pools this claim may take from
        seen = _Counts.read(ran[0].rows, limits.global_limit, limits.max_claims)
        grabbed = slot_sql.Grabbed.read(ran[-2].rows, ran[-1].rows) if keeps else None
        room = pool_state.PoolRoom.read(
            conn,
            ran[1].rows,
            seen.in_flight,
            limits.pool_limit,
            limits.global_limit,
            limits.rules,
            limits.proven,
            limits.hold,
            turns=mine,
        )
        room_left = seen.free
        if grabbed is not None:
            room.slot_caps = {p: len(grabbed.pools.get(p, [])) for p in slotted}
            room_left = min(seen.free, len(grabbed.global_nos))
        due = [row for row in candidates if row.endpoint in mine]
        picked = self._pick(conn, due, room, room_left, limits.daily_budget) if room_left > 0 else []
        return seen, room, picked, grabbed

    def _slot_reads(
        self,
        limits: _Limits,
        candidates: list[Any],
        pools: list[str],
        slotted: list[str],
        free: int,
        view: pool_state.PoolRoom,
    ) -> list[tuple[Any, dict[str, Any]]]:
        """The statements that lock free slots: global ones for up to `free` candidates, each
        slotted pool's for its candidates up to its room in `view` (slots missing made first)."""
        per_pool = {p: sum(1 for r in candidates if r.endpoint == p) for p in pools}
        wanted = sum(per_pool.values())
        made = {p: min(limits.pool_limit(p), limits.global_limit) for p in slotted}
        self.make_slots(limits.global_limit, made)  # a pool seen for the first time, or its limit raised
        asked = []
        for p in slotted:
            lim = min(view.limit(p), made[p])
            want = min(per_pool[p], free, max(lim - view.in_flight.get(p, 0), 0))
            if want > 0:
                asked.append({"pool": p, "lim": lim, "want": want})
        return slot_sql.grab(limits.global_limit, min(wanted, free), asked)

    def _pick(
        self, conn: Connection, rows: list[Any], room: pool_state.PoolRoom, free_total: int, daily_budget: float | None
    ) -> list[int]:
        """Candidates in claim order that fit their pool's room and the budgets, up to `free_total`."""
        picked: list[int] = []
        budget = Budget.read(conn, daily_budget, rows, self.job_caps, self._job_turns(conn))
        for row in rows:
            if room.fits(row.endpoint, row.token_estimate) and budget.reserve(row.job_id, row.estimate_usd):
                room.take(row.id, row.endpoint, row.token_estimate)
                picked.append(row.id)
                if len(picked) == free_total:
                    break
        return picked

    def _job_turns(self, conn: Connection) -> Callable[[list[str]], set[str]]:
        """Take jobs' turns (a job's budget is its own figure: reservations against it one at a
        time), answering the jobs whose turn this transaction holds."""

        def take(job_ids: list[str]) -> set[str]:
            turns, _ = self.dialect.take_turns(conn, [(JOB, j) for j in job_ids])
            return {name for _, name in turns}

        return take
