"""The response cache's SQL: a request answered from an identical one the ledger already holds,
or made to wait for an identical one in flight (its twin), instead of being paid for again.

Two requests with one `cache_key` ask the same question for the same sample
(`ledger.fingerprint.cache_key`). A *source* is an original answer worth copying: a request
`completed` by a provider (not itself a copy: `cached_from` is NULL), whose answer was not cut
off at its token limit. Every statement here keeps to that definition (`_is_source`).

- At enqueue (`resolve`, in the enqueue's own transaction): a new request that allows the cache
  and has a source is written `completed` at once, its answer copied (`cached_from` the
  source, cost 0, tokens kept as the answer's); one that has no source but an identical request
  in flight (queued, running or submitted, not itself waiting) waits for it (`twin_of`), and is
  never claimed meanwhile (every claim and batch selection leaves out `twin_of IS NOT NULL`).
  Which one it waits for is chosen so that a question has one original in flight, whatever the
  order of enqueues (`resolve`).
- When an original ends, in the transaction that records it (`TWINS_ANSWERED`, `TWINS_RELEASED`,
  run by the group commit and by batch mapping): its twins complete from it as cache hits; or,
  when it ended without a source's answer (error, canceled, cut off), the first of its twins
  becomes the original and the others wait for that one.
- The claim's periodic sweep (`sweep_twins`) settles twins whose original ended in a way the
  statements above did not see (a cancel, a race with an enqueue on PostgreSQL): answered; made
  to wait for the question's other original (or answered from its newer source) where there is
  one; else released.

A twin's answer is copied with its parsed fields only when both parse alike (`parse`); an
enqueue's twin is found among requests that parse alike for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    and_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    not_,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.sql.expression import ColumnElement

from ledger.statuses import RequestStatus
from ledger.store.answers import ANSWER_FIELDS
from ledger.store.dialect import Dialect, db_now, db_now_plus, db_today, unindexed
from ledger.store.row_sets import bound_rows, ids_in
from ledger.store.tables import requests

_r = requests.c
QUEUED, RUNNING, COMPLETED = RequestStatus.QUEUED.value, RequestStatus.RUNNING.value, RequestStatus.COMPLETED.value
IN_FLIGHT = (QUEUED, RUNNING, RequestStatus.SUBMITTED.value)
# The answer's columns a hit copies, and its parsed fields (copied when both parse alike).
ANSWER_COLUMNS = ("raw_output", "input_tokens", "output_tokens", *ANSWER_FIELDS, "last_status_code")
DERIVED_COLUMNS = ("reasoning", "verdict_text", "parsed_verdict", "parse_error", "parsed", "parsed_at")
# A source at most this old when LEDGER_CACHE_MAX_AGE_DAYS is unset: a hundred years.
NO_AGE_LIMIT_DAYS = 36_500


def _is_source(t: Any) -> ColumnElement[bool]:
    """`t` (a `requests` alias's columns) holds an original answer worth copying. Sources are
    always reached by key or by id, never through the status index (every completed request)."""
    return and_(
        unindexed(t.status) == COMPLETED,
        t.cached_from.is_(None),
        or_(t.finish_reason.is_(None), t.finish_reason != "length"),
    )


def _in_flight(t: Any, status: Callable[[Any], Any] = lambda c: c) -> ColumnElement[bool]:
    """`t` is queued, running or submitted (no IN list: the hot statements bind no expanding list)."""
    return or_(*[status(t.status) == value for value in IN_FLIGHT])


def _copied_from(src: Any, new: Any = _r) -> dict[str, Any]:
    """The values a request (`new`: its columns) completed from `src` (a `requests` alias's
    columns) takes."""
    alike = new.parse.is_not_distinct_from(src.parse)
    return {
        **{name: src[name] for name in ANSWER_COLUMNS},
        **{name: case((alike, src[name]), else_=None) for name in DERIVED_COLUMNS},
        "status": COMPLETED,
        "cost_usd": 0.0,
        "reserved_usd": None,
        "cached_from": src.id,
        "twin_of": None,
        "error_code": None,
        "error_message": None,
        "completed_at": db_now(),
        "updated_at": db_now(),
    }


_src, _cand, _n = requests.alias("src"), requests.alias("cand"), requests.alias("n")
# Every other request with a new request's key, with what decides whether it is that request's
# source or the original it waits for (`resolve` decides): one statement, found by key through
# its index; a new request with no other of its key (the usual case) costs one index probe.
_SAME_KEY = (
    select(
        _n.c.id,
        _n.c.endpoint,
        _cand.c.id,
        and_(_is_source(_cand.c), _cand.c.completed_at >= db_now_plus(bindparam("b_age"))),
        and_(_in_flight(_cand.c, unindexed), _cand.c.twin_of.is_(None), _cand.c.parse.is_not_distinct_from(_n.c.parse)),
        and_(
            unindexed(_cand.c.status) == QUEUED,
            _cand.c.twin_of.is_not(None),
            _cand.c.parse.is_not_distinct_from(_n.c.parse),
        ),
    )
    .select_from(_n.join(_cand, _cand.c.cache_key == _n.c.cache_key))
    .where(
        ids_in(_n.c.id, "b_ids"),
        _n.c.use_cache == true(),
        unindexed(_n.c.status) == QUEUED,
        _n.c.twin_of.is_(None),
        _cand.c.id != _n.c.id,
    )
)
# A new request answered from its source (`HITS.bind`: rows of request id and source id).
HITS = bound_rows("h", "b_hits", column("id", BigInteger), column("src", BigInteger), keys="b_hit_ids")
_HIT = (
    update(requests)
    .where(HITS.match(_r.id), _src.c.id == HITS.c.src, unindexed(_r.status) == QUEUED)
    .values(**_copied_from(_src.c))
)
# Hits copied per statement. PostgreSQL looks each hit up by its id and by the set's array of ids
# (`bound_rows.match`), and prepares that array again for every lookup, so a statement's cost
# grows with the square of its hits: 5,000 in one statement took 1.4 s of an enqueue chunk's
# 1.7 (EXPLAIN ANALYZE); in statements of 500, 100,000 hits were enqueued in 13 s, not 42.
HITS_PER_STATEMENT = 500
_WAIT_FOR = update(requests).where(_r.id == bindparam("b_id")).values(twin_of=bindparam("b_original"))


@dataclass(frozen=True)
class CachePolicy:
    """An enqueue's use of the cache (`Settings.cache_policy`; None where LEDGER_CACHE=off)."""

    max_age_days: float | None = None  # the oldest source copied (None: any age)

    @property
    def age_seconds(self) -> float:
        """How old a source may be, as seconds to add to now (negative)."""
        return -float(self.max_age_days if self.max_age_days is not None else NO_AGE_LIMIT_DAYS) * 86400.0


@dataclass(frozen=True)
class Hit:
    request_id: int
    cached_from: int
    endpoint: str


@dataclass(frozen=True)
class Resolved:
    """What the cache did for an enqueue's new requests."""

    hits: list[Hit]
    twins: int


NOTHING_RESOLVED = Resolved([], 0)


def between_statements(point: str, conn: Connection) -> None:
    """Where a test holds one enqueue (`conn` its transaction's connection) between its statements
    while others run (it replaces this function): `"inserted"` after the new rows are written,
    before their questions' turns are taken; `"read"` after the rows of their key were read, before anything is
    decided from them. Does nothing."""


def resolve(conn: Connection, dialect: Dialect, ids: list[int], policy: CachePolicy | None) -> Resolved:
    """Answer `ids` (new requests, inside their enqueue's transaction) from the cache where a
    source exists; make those with an identical request in flight wait for it.

    Enqueues of one question resolve one at a time (`Dialect.take_question_turns`): one that commits first is seen whole
    by the next, whose identical requests wait for its originals; enqueues of different
    questions do not wait for each other."""
    if not ids or policy is None:
        return NOTHING_RESOLVED
    between_statements("inserted", conn)
    dialect.take_question_turns(conn, ids)
    age = policy.age_seconds
    # Per new request: its source, the first answer worth copying; else the request it waits for,
    # the first of these that exists:
    # - an identical original in flight of another enqueue (committed: the only uncommitted rows
    #   this transaction sees are its own). Never one of this enqueue's own when another's exists:
    #   ids are taken at insert, so on PostgreSQL an enqueue that wrote first but resolves second
    #   has the lower ids, and its second copy of a question would wait for its first, itself a
    #   twin: released as an original once the first was answered from the cache, a second call;
    # - an identical twin whose original ended unseen (a cancel: were its original in flight, it
    #   would be the one above): the sweep makes it the original or finds it another, and this
    #   request follows it; made an original of its own, it would be called beside it;
    # - the first identical new request before it (the first of several is the others' original).
    new, source, pools = set(ids), dict[int, int](), dict[int, str]()
    theirs, stranded, ours = dict[int, int](), dict[int, int](), dict[int, int]()
    found = conn.execute(_SAME_KEY, {"b_ids": ids, "b_age": age}).all()
    between_statements("read", conn)
    for request_id, endpoint, other, is_source, in_flight, waiting in found:
        pools[request_id] = endpoint
        if is_source:
            source[request_id] = min(source.get(request_id, other), other)
        elif in_flight and other not in new:
            theirs[request_id] = min(theirs.get(request_id, other), other)
        elif waiting:
            stranded[request_id] = min(stranded.get(request_id, other), other)
        elif in_flight and other < request_id:
            ours[request_id] = min(ours.get(request_id, other), other)
    original = ours | stranded | theirs
    if source:
        rows = [{"id": i, "src": s} for i, s in sorted(source.items())]
        for at in range(0, len(rows), HITS_PER_STATEMENT):
            dialect.execute(conn, _HIT, HITS.bind(rows[at : at + HITS_PER_STATEMENT]))
    waiting = {i: o for i, o in original.items() if i not in source}
    if waiting:
        conn.execute(_WAIT_FOR, [{"b_id": i, "b_original": o} for i, o in sorted(waiting.items())])
    hits = [Hit(i, s, pools[i]) for i, s in sorted(source.items())]
    return Resolved(hits, len(waiting))


# -- answered as they are inserted ---------------------------------------------

# What a hit takes only because it is one: a request inserted without a source takes these
# columns' defaults instead (queued, not copied, no cost yet).
_ONLY_A_HIT = {"status": QUEUED, "cached_from": None, "completed_at": None, "cost_usd": None}
# What `_copied_from` sets that a request just inserted has already (or takes with its clock).
_AS_INSERTED = ("reserved_usd", "twin_of", "error_code", "error_message", "updated_at")


def answered_at_insert(rows: Any, policy: CachePolicy | None) -> tuple[Any, Any, dict[str, Any]]:
    """For an insert of new requests from `rows` (a table of their columns): `new`, those rows
    with the id of each one's source (the first answer worth copying; none where the request
    does not allow the cache, or with no `policy`); `new` joined to that source; and the
    values of the columns a hit sets, which come out as an unanswered request's defaults where
    no source was found.

    A hit written this way is written once, where an update after the insert rewrote the
    whole row and its index entries a second time. It needs no question's turn: a source is a
    committed answer, which every enqueue may copy, whatever the others do meanwhile (twins
    are what takes turns: `resolve`, for the requests inserted without a source).

    The source's id is found first, by its question's index (a column of `new`), then the
    source is joined by its primary key. Looked up in the join's condition instead, it left
    PostgreSQL no key to join by: it hashed the whole ledger, for every chunk."""
    src, other = requests.alias("src"), requests.alias("other")
    first: Any = cast(null(), BigInteger)  # the cache off (LEDGER_CACHE=off): no lookup at all
    if policy is not None:
        found = and_(
            rows.c.use_cache == true(),
            other.c.cache_key == rows.c.cache_key,
            _is_source(other.c),
            # Never by the index of answers' times (a source's `completed_at` is always set, and
            # `coalesce` keeps the planner from inferring that): with statistics from before the
            # ledger's answers came (all NULL), PostgreSQL took that partial index for empty and
            # read every answer in it for each new request, where the question's index finds its one.
            func.coalesce(other.c.completed_at, other.c.created_at) >= db_now_plus(literal(policy.age_seconds)),
        )
        first = select(other.c.id).where(found).order_by(other.c.id).limit(1).scalar_subquery()
    new = select(rows, first.label("source")).subquery("chunk")
    values: dict[str, Any] = {}
    for name, value in _copied_from(src.c, new.c).items():
        if name in _ONLY_A_HIT:
            value = case((src.c.id.is_not(None), value), else_=literal(_ONLY_A_HIT[name]))
        if name not in _AS_INSERTED:
            values[name] = value
    return new, new.outerjoin(src, src.c.id == new.c.source), values


# -- when an original ends ------------------------------------------------------

# The requests whose outcomes a transaction wrote (a group commit's, a chunk of batch results').
ENDED = bound_rows("e", "b_ended", column("id", BigInteger), keys="b_ended_ids")
_orig = requests.alias("orig")
_o = _orig.c


def _answered(twins: ColumnElement[bool]) -> Any:
    """Twins (`twins` selects them by `twin_of`) whose original has a source's answer: completed
    from it. Twins are found by `twin_of` through its partial index, never by a scan."""
    return (
        update(requests)
        .where(_r.twin_of.is_not(None), twins, _o.id == _r.twin_of, unindexed(_r.status) == QUEUED, _is_source(_o))
        .values(**_copied_from(_o))
    )


def _released(twins: Callable[[Any], ColumnElement[bool]]) -> Any:
    """Twins (`twins(alias)` selects them by `twin_of`) whose original ended without a source's
    answer (error, canceled, cut off): the first of each original's twins is claimed normally,
    the rest wait for it. The first is picked per original before any row changes (an aggregate)."""
    twin = requests.alias("twin")
    ended = (
        select(twin.c.twin_of.label("old"), func.min(twin.c.id).label("first"))
        .where(
            twin.c.twin_of.is_not(None),
            twins(twin.c.twin_of),
            _o.id == twin.c.twin_of,
            unindexed(twin.c.status) == QUEUED,
            not_(_in_flight(_o)),
            not_(_is_source(_o)),
        )
        .group_by(twin.c.twin_of)
        .subquery("ended")
    )
    return (
        update(requests)
        # Looked up by `twin_of` from the few originals that ended, never by status (the queue).
        .where(_r.twin_of.is_not(None), _r.twin_of == ended.c.old, unindexed(_r.status) == QUEUED)
        .values(twin_of=case((_r.id == ended.c.first, None), else_=ended.c.first), updated_at=db_now())
    )


def _repointed() -> Any:
    """Twins whose original is neither an original in flight nor a source (it ended without an
    answer unseen by the statement that ended it, or it is itself waiting or a copy) but whose
    question has one: they wait for that one instead, a source first (which `_answered` then
    copies), rather than be released as an original and called beside it. A source counts only
    when answered after the twin was made: an older one was no hit for it (the cache's age limit)."""
    other = requests.alias("other")
    source = and_(_is_source(other.c), other.c.completed_at >= _r.created_at)
    better = (
        select(other.c.id)
        .where(
            other.c.cache_key == _r.cache_key,
            other.c.id != _r.id,
            other.c.parse.is_not_distinct_from(_r.parse),
            or_(source, and_(_in_flight(other.c, unindexed), other.c.twin_of.is_(None))),
        )
        # What is completed here is a source (SQLite's ORDER BY cannot name the outer row).
        .order_by(case((unindexed(other.c.status) == COMPLETED, 0), else_=1), other.c.id)
        .limit(1)
        .scalar_subquery()
    )
    # The other request is looked up (SET) only for the few twins the WHERE keeps: in the WHERE,
    # it would be looked up for every waiting twin before the join to its original filtered them.
    # A twin it finds none for keeps its original (and is released next, or waits for the twin
    # it waits for to be released).
    return (
        update(requests)
        .where(
            _r.twin_of.is_not(None),
            _o.id == _r.twin_of,
            unindexed(_r.status) == QUEUED,
            not_(or_(and_(_in_flight(_o, unindexed), _o.twin_of.is_(None)), _is_source(_o))),
        )
        .values(twin_of=func.coalesce(better, _r.twin_of), updated_at=db_now())
    )


# Run with the outcomes they follow (hot statements: `ENDED.bind([{"id": ...}, ...])`).
TWINS_ANSWERED = _answered(ENDED.match(_r.twin_of)).returning(_r.id, _r.cached_from)
# Whether any request waits for a twin at all: one probe of `twin_of`'s partial index (an empty
# index when nobody waits), which spares a batch's every chunk the two statements above.
ANY_TWIN = select(_r.id).where(_r.twin_of.is_not(None)).limit(1)
TWINS_RELEASED = _released(ENDED.match)
_SWEEP = (_repointed(), _answered(true()), _released(lambda _: true()))


def sweep_twins(conn: Connection) -> int:
    """Every waiting twin whose original has ended: answered from it; or, when it ended without
    an answer, made to wait for another original of its question (or answered from a newer
    source) where there is one, else released. Returns how many twins its statements wrote."""
    return sum(int(conn.execute(stmt).rowcount or 0) for stmt in _SWEEP)


# -- what the cache saved ---------------------------------------------------------

_HITS_TODAY = (
    select(func.count(), func.coalesce(func.sum(_src.c.cost_usd), 0.0))
    .select_from(requests.join(_src, _src.c.id == _r.cached_from))
    .where(_r.cached_from.is_not(None), _r.completed_at >= db_today())
)
_HITS_BY_POOL = select(_r.endpoint, func.count()).where(_r.cached_from.is_not(None)).group_by(_r.endpoint)


def hits_today(conn: Connection) -> tuple[int, float]:
    """Requests answered from the cache today (UTC), and what their sources cost."""
    count, saved = conn.execute(_HITS_TODAY).one()
    return int(count), float(saved or 0.0)


def hits_by_pool(conn: Connection) -> dict[str, int]:
    """Requests ever answered from the cache, per pool."""
    return {str(endpoint): int(n) for endpoint, n in conn.execute(_HITS_BY_POOL)}
