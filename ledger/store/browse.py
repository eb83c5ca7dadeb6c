"""What the web view reads (`ledger.web`): bounded queries, each fast on a million requests.

Every query here answers from an index or a bounded slice of one, never from a whole table:

- Request lists walk the primary key downwards in slices (`request_page`): a page examines at most
  `SCAN_ROWS` ids, and when that budget runs out before the page is full, the page ends where the
  walk stopped and its "next" link goes on from there. A filter by job walks the job's own index
  instead (`ix_llm_requests_job_id`, migration 0013); "had a 429" reads the attempts' partial
  index of 429s (`ix_llm_attempts_429`, the same migration). The other filters are checks on the
  rows the walk reaches (kept off the planner's index choice with `unindexed`: an index on status
  would hand the planner a million completed rows to sort).
- Counts that could reach the whole table (requests by status and pool) count at most `COUNT_CAP`
  rows each (a finished status `FINAL_COUNT_CAP`) and say so (`Count.capped`). Each row counted
  may be a read of its table row: PostgreSQL answers from the index alone only for pages its
  last VACUUM marked all-visible, and a ledger's changing rows (or one never vacuumed) are not.
- Spend over time is summed an hour at a time (`spend_between`, a range of the completion index);
  the web view keeps each hour that has ended (`ledger.web.spend`), so a page sums the current
  hour only. An hour holding more than `SPEND_ROWS` completions is summed up to there and says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, func, literal, or_, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.elements import ColumnElement

from ledger.models import Job, LlmAttempt, LlmBatch, LlmPool, LlmPoolCall, LlmWorker, Opinion
from ledger.statuses import FINAL_STATUSES, RequestStatus
from ledger.store.commit import reading
from ledger.store.dialect import Dialect, as_utc, db_now, db_now_plus, seconds_between, unindexed
from ledger.store.jobs import progress_columns, progress_of
from ledger.store.tables import requests

jobs = Job.__table__  # type: ignore[attr-defined]
opinions = Opinion.__table__  # type: ignore[attr-defined]
attempts = LlmAttempt.__table__  # type: ignore[attr-defined]
batches = LlmBatch.__table__  # type: ignore[attr-defined]
pools = LlmPool.__table__  # type: ignore[attr-defined]
pool_calls = LlmPoolCall.__table__  # type: ignore[attr-defined]
workers = LlmWorker.__table__  # type: ignore[attr-defined]

# Ids a request page examines at most (in slices growing from FIRST_SLICE) before it ends early.
SCAN_ROWS = 120_000
FIRST_SLICE = 5_000
# Rows a count of waiting or running requests reads at most; beyond it the page says "N+".
COUNT_CAP = 10_000
# The same for a finished status (completed, error, canceled): the rows that grow with the ledger,
# scattered over it (an error every few pages), each a page read where not all-visible.
FINAL_COUNT_CAP = 1_000
# A job's newest requests its summary reads at most (a larger job's page says so).
JOB_ROWS = 50_000
# Completed requests one hour's spend sums at most.
SPEND_ROWS = 100_000
# The newest attempts the overview reads for calls started in the rate window (pools without a cap).
RECENT_ATTEMPTS = 20_000
# Pools per status the overview lists at most.
MOST_POOLS = 200
# The rate window the overview shows a pool's calls and tokens in (the RPM/TPM caps' window).
RATE_WINDOW_S = 60.0

# The columns a request list shows (never the input, output or body: those are on its own page).
REQUEST_LIST_COLUMNS = (
    "id",
    "idempotency_key",
    "job_id",
    "provider",
    "model",
    "endpoint",
    "delivery",
    "status",
    "finish_reason",
    "attempts",
    "last_status_code",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "latency_ms",
    "parse_error",
    "error_code",
    "created_at",
)
# The attempts' 429s (the partial index of migration 0013 holds only these rows).
TOO_MANY = 429


@dataclass(frozen=True)
class Count:
    """A count that stops at a cap: `capped` says the true number is larger."""

    n: int
    capped: bool = False


@dataclass(frozen=True)
class RequestFilter:
    """The `/requests` filters; every field optional. `q` searches custom ids (substring)."""

    status: str | None = None
    job: str | None = None
    pool: str | None = None
    provider: str | None = None
    model: str | None = None
    delivery: str | None = None
    finish_reason: str | None = None
    q: str | None = None
    parse_error: bool = False
    had_429: bool = False
    batch: int | None = None  # a provider batch's requests (its partial index drives the walk)

    def checks(self) -> list[ColumnElement[bool]]:
        """The row checks (the job is the walk's own index, see `request_page`)."""
        c = requests.c
        found: list[ColumnElement[bool]] = []
        for name, column in (
            ("status", c.status),
            ("pool", c.endpoint),
            ("provider", c.provider),
            ("model", c.model),
            ("delivery", c.delivery),
            ("finish_reason", c.finish_reason),
        ):
            value = getattr(self, name)
            if value:
                found.append(unindexed(column) == value)
        if self.q:
            escaped = self.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            found.append(unindexed(c.idempotency_key).like(f"%{escaped}%", escape="\\"))
        if self.parse_error:
            found.append(c.parse_error.is_not(None))
        return found


@dataclass
class RequestPage:
    """One page of requests, newest first. `next_before`: where the next page starts (None: the
    end). `scanned_to`: the lowest id examined when the page ended before it was full (the scan
    budget ran out there), so the page can say how far it looked."""

    rows: list[dict[str, Any]]
    next_before: int | None
    scanned_to: int | None = None


@dataclass
class PoolView:
    """A pool as the overview shows it."""

    endpoint: str
    running: Count
    queued: Count
    learned_limit: int | None = None
    cooldown_until: Any = None
    paused_reason: str | None = None
    window_calls: int = 0
    window_tokens: int = 0
    window_left: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class BrowseQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    # -- change probe --------------------------------------------------------

    def change_marks(self) -> dict[str, Any]:
        """A cheap fingerprint of what the web view shows, per area: one query, each part an
        index's end or a small table. It changes when a request is enqueued (newest id), claimed
        or retried (newest attempt), finished or canceled (newest completion), when an attempt
        ends (newest finish, through the attempts' rows of the newest requests only), and when a
        job, batch, pool or opinion changes. Portable: the same statement on both databases."""
        newest = select(func.max(attempts.c.id)).scalar_subquery()
        query = select(
            select(func.max(requests.c.id)).scalar_subquery().label("requests"),
            select(func.max(requests.c.completed_at)).scalar_subquery().label("completed"),
            newest.label("attempts"),
            select(attempts.c.finished_at).where(attempts.c.id == newest).scalar_subquery().label("attempt_end"),
            select(func.max(jobs.c.updated_at)).scalar_subquery().label("jobs"),
            select(func.max(opinions.c.id)).scalar_subquery().label("opinions"),
            select(func.max(batches.c.updated_at)).scalar_subquery().label("batches"),
            select(func.max(pools.c.updated_at)).scalar_subquery().label("pools"),
        )
        with reading(self.engine) as conn:
            row = conn.execute(query).one()
        return {key: "" if value is None else str(value) for key, value in row._mapping.items()}

    # -- overview ------------------------------------------------------------

    def requests_by_pool(self) -> dict[str, dict[str, Count]]:
        """Requests per pool and status, each (pool, status) counted up to `COUNT_CAP` (a finished
        status up to `FINAL_COUNT_CAP`) through the (status, endpoint) index. A status's pools are
        found by seeking that index from one pool to the next (a handful of index probes), never by
        reading its entries; every status moves on in the same statement, which also counts the
        pool each has reached, so a view costs as many statements as the most pools a status has."""
        c = requests.c
        found: dict[str, dict[str, Count]] = {}
        statuses = [status.value for status in RequestStatus]
        with reading(self.engine) as conn:
            first = conn.execute(select(*[_next_pool(status) for status in statuses])).one()
            reached = {s: e for s, e in zip(statuses, first, strict=True) if e is not None}
            for _ in range(MOST_POOLS):
                if not reached:
                    break
                columns = []
                for status, endpoint in reached.items():
                    cap = FINAL_COUNT_CAP if status in FINAL_STATUSES else COUNT_CAP
                    columns += [_capped(cap, c.status == status, c.endpoint == endpoint), _next_pool(status, endpoint)]
                row = conn.execute(select(*columns)).one()
                following = {}
                for k, (status, endpoint) in enumerate(reached.items()):
                    n, after = row[2 * k], row[2 * k + 1]
                    cap = FINAL_COUNT_CAP if status in FINAL_STATUSES else COUNT_CAP
                    found.setdefault(str(endpoint), {})[status] = Count(min(n, cap), capped=n > cap)
                    if after is not None:
                        following[status] = after
                reached = following
        return {pool: found[pool] for pool in sorted(found)}

    def pool_views(self, by_pool: dict[str, dict[str, Count]] | None = None) -> list[PoolView]:
        """Each pool with requests, or with state of its own: busy and queued (capped counts, from
        `by_pool` when the caller has them), learned limit, cooldown or pause, and its calls and
        tokens in the current rate window."""
        counts = self.requests_by_pool() if by_pool is None else by_pool
        with reading(self.engine) as conn:
            found: dict[str, PoolView] = {}
            for endpoint, statuses in counts.items():
                running = statuses.get(RequestStatus.RUNNING.value, Count(0))
                queued = statuses.get(RequestStatus.QUEUED.value, Count(0))
                found[endpoint] = PoolView(endpoint, running, queued)
            _read_pool_state(conn, found)
            _read_window_use(conn, found)
        return [found[key] for key in sorted(found)]

    def oldest_queued(self) -> dict[str, Any] | None:
        """The oldest queued request (the lowest id among the first `COUNT_CAP` queued rows the
        status index holds: all of them unless more are queued), with its age in seconds."""
        c = requests.c
        with reading(self.engine) as conn:
            queued = select(c.id).where(c.status == RequestStatus.QUEUED.value).limit(COUNT_CAP).subquery()
            first = conn.execute(select(func.min(queued.c.id))).scalar_one_or_none()
            if first is None:
                return None
            row = conn.execute(
                select(c.id, c.idempotency_key, c.endpoint, c.created_at, db_now().label("now")).where(c.id == first)
            ).one()
        found = dict(row._mapping)
        found["age_s"] = seconds_between(found.pop("created_at"), found.pop("now"))
        return found

    def heard_from(self, within_s: float) -> int:
        """Daemons whose heartbeat is younger than `within_s`."""
        with reading(self.engine) as conn:
            query = select(func.count()).where(workers.c.heartbeat_at > db_now_plus(-within_s))
            return int(conn.execute(query).scalar_one())

    def started_within(self, within_s: float) -> bool:
        """Whether any attempt started in the last `within_s` seconds (the newest attempts only)."""
        newest = select(func.max(attempts.c.id)).scalar_subquery()
        with reading(self.engine) as conn:
            query = select(attempts.c.started_at > db_now_plus(-within_s)).where(attempts.c.id == newest)
            return bool(conn.execute(query).scalar_one_or_none())

    # -- jobs ----------------------------------------------------------------

    def job_list(self, limit: int = 50, before: tuple[Any, str] | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first; `before` = (created_at, id) of the last row of the previous page."""
        query = (
            select(jobs.c.id, jobs.c.kind, jobs.c.status, jobs.c.phase, jobs.c.budget_usd, jobs.c.error)
            .add_columns(jobs.c.created_at, jobs.c.started_at, jobs.c.completed_at, jobs.c.updated_at)
            .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
            .limit(limit)
        )
        if before is not None:
            at, job_id = before
            query = query.where(or_(jobs.c.created_at < at, and_(jobs.c.created_at == at, jobs.c.id < job_id)))
        with reading(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    def job_summary(self, job_ids: Sequence[str], *, errors: bool = False) -> dict[str, dict[str, Any]]:
        """Per job: requests done/total, in flight, cut off at max_tokens and spend (costs plus
        what calls in flight reserve, as `job_progress` counts them) in one read of the job's
        newest `JOB_ROWS` requests through its index (`capped`: the job has more, and the numbers
        are those of its newest); with `errors`, its failed requests among them grouped by kind,
        most first. One job per statement: PostgreSQL plans `job_id IN (a, b)` over two large
        jobs as a scan of both indexes' bitmaps, four times the cost of the reads one at a time."""
        found: dict[str, dict[str, Any]] = {}
        with reading(self.engine) as conn:
            for job in job_ids:
                # More than JOB_ROWS? One entry of the (job_id, id) index past them, read from it alone.
                beyond = select(requests.c.id).where(requests.c.job_id == job).order_by(requests.c.id.desc())
                capped = conn.execute(beyond.offset(JOB_ROWS).limit(1)).first() is not None
                rows: Any = requests
                if capped:  # the newest JOB_ROWS only (a subquery; SQLite reads it once per statement)
                    rows = (
                        select(requests.c.id, requests.c.status, requests.c.finish_reason, requests.c.cost_usd)
                        .add_columns(requests.c.reserved_usd, requests.c.error_code, requests.c.last_status_code)
                        .add_columns(requests.c.job_id)
                        .where(requests.c.job_id == job)
                        .order_by(requests.c.id.desc())
                        .limit(JOB_ROWS)
                        .subquery()
                    )
                c = rows.c
                progress = progress_of(conn.execute(select(*progress_columns(c)).where(c.job_id == job)).one())
                kinds = (
                    select(c.error_code, c.last_status_code, func.count().label("n"), func.min(c.id).label("first_id"))
                    .where(c.job_id == job, unindexed(c.status) == RequestStatus.ERROR.value)
                    .group_by(c.error_code, c.last_status_code)
                    .order_by(func.count().desc())
                    .limit(50)
                )
                errors_by_kind = [dict(r._mapping) for r in conn.execute(kinds)] if errors else []
                found[job] = {**progress, "capped": capped, "errors": errors_by_kind}
        return found

    def cell_opinions(self, job_id: str, agent: str, dimension: str) -> list[dict[str, Any]]:
        """One matrix cell: its opinions (each sample) with their requests' status and attempts."""
        o, c = opinions.c, requests.c
        query = (
            select(o.sample, o.score, o.argument, o.parse_error, o.request_id)
            .add_columns(c.status, c.attempts, c.idempotency_key, c.finish_reason, c.last_status_code)
            .select_from(opinions.outerjoin(requests, c.id == o.request_id))
            .where(o.job_id == job_id, o.agent == agent, o.dimension == dimension)
            .order_by(o.sample, o.id)
        )
        with reading(self.engine) as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- requests ------------------------------------------------------------

    def request_page(self, where: RequestFilter, *, before: int | None = None, limit: int = 50) -> RequestPage:
        """A page of requests newest first, from below id `before` (keyset). See the module's
        docstring for how the walk stays bounded."""
        columns = [requests.c[name] for name in REQUEST_LIST_COLUMNS]
        checks = where.checks()
        with reading(self.engine) as conn:
            top = before if before is not None else _top_id(conn)
            if top is None:
                return RequestPage([], None)
            if where.job or where.batch is not None:  # the job's (or batch's) own index, bounded by its size
                query = select(*columns).where(requests.c.id < top, *checks)
                if where.job:
                    query = query.where(requests.c.job_id == where.job)
                if where.batch is not None:
                    query = query.where(requests.c.batch_id == where.batch)
                if where.had_429:
                    query = query.where(requests.c.id.in_(_had_429(0, top)))
                rows = [dict(r._mapping) for r in conn.execute(query.order_by(requests.c.id.desc()).limit(limit + 1))]
                more = len(rows) > limit
                return RequestPage(rows[:limit], rows[limit - 1]["id"] if more else None)
            rows, examined, size, high = [], 0, FIRST_SLICE, top
            while high > 1 and examined < SCAN_ROWS and len(rows) <= limit:
                low = max(high - size, 1)
                query = select(*columns).where(requests.c.id >= low, requests.c.id < high, *checks)
                if where.had_429:
                    query = query.where(requests.c.id.in_(_had_429(low, high)))
                query = query.order_by(requests.c.id.desc()).limit(limit + 1 - len(rows))
                rows.extend(dict(r._mapping) for r in conn.execute(query))
                examined += high - low
                high, size = low, min(size * 2, SCAN_ROWS)
        if len(rows) > limit:
            return RequestPage(rows[:limit], rows[limit - 1]["id"])
        if high > 1:  # the budget ran out first: the next page goes on below where this one looked
            return RequestPage(rows, high, scanned_to=high)
        return RequestPage(rows, None)

    def export_requests(self, where: RequestFilter, chunk: int = 2_000) -> Iterator[dict[str, Any]]:
        """Every request the filter selects, newest first, a page at a time (the export streams
        it): the same walk as `request_page`, with no budget but the table's end."""
        before: int | None = None
        while True:
            page = self.request_page(where, before=before, limit=chunk)
            ids = [row["id"] for row in page.rows]
            if ids:
                yield from self._export_rows(ids)
            if page.next_before is None:
                return
            before = page.next_before

    def _export_rows(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        columns = [c for c in requests.c if c.name not in ("response", "input")]
        with reading(self.engine) as conn:
            query = select(*columns).where(requests.c.id.in_(list(ids))).order_by(requests.c.id.desc())
            return [dict(r._mapping) for r in conn.execute(query)]

    def request_by_custom_id(self, custom_id: str) -> int | None:
        """The request whose custom_id (idempotency key) is exactly this one: its unique index."""
        with reading(self.engine) as conn:
            query = select(requests.c.id).where(requests.c.idempotency_key == custom_id)
            found = conn.execute(query).scalar_one_or_none()
        return None if found is None else int(found)

    def request_opinions(self, request_id: int) -> list[dict[str, Any]]:
        """The opinions an answer became (an evaluation job's request)."""
        o = opinions.c
        with reading(self.engine) as conn:
            query = select(o.job_id, o.agent, o.dimension, o.sample, o.score, o.parse_error).where(
                o.request_id == request_id
            )
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- batches -------------------------------------------------------------

    def batch_page(self, *, before: int | None = None, limit: int = 25) -> tuple[list[dict[str, Any]], int | None]:
        """Provider batches newest first, with their requests' outcomes and cost (one grouped read of
        this page's batches' requests, through the batch index), and each one's age in seconds."""
        b, c = batches.c, requests.c
        query = select(
            b.id, b.provider, b.model, b.job_id, b.status, b.provider_status, b.provider_batch_id, b.request_total
        ).add_columns(b.error, b.created_at, b.submitted_at, b.completed_at, db_now().label("now"))
        if before is not None:
            query = query.where(b.id < before)
        with reading(self.engine) as conn:
            found = [dict(r._mapping) for r in conn.execute(query.order_by(b.id.desc()).limit(limit + 1))]
            more = len(found) > limit
            found = found[:limit]
            ids = [row["id"] for row in found]
            sums: dict[int, dict[str, Any]] = {}
            if ids:
                done = func.sum(case((c.status == RequestStatus.COMPLETED.value, 1), else_=0))
                failed = func.sum(case((c.status == RequestStatus.ERROR.value, 1), else_=0))
                grouped = conn.execute(
                    select(c.batch_id, done, failed, func.sum(c.cost_usd))
                    .where(c.batch_id.in_(ids))
                    .group_by(c.batch_id)
                )
                sums = {int(i): {"completed": d, "failed": f, "cost_usd": cost} for i, d, f, cost in grouped}
        for row in found:
            row.update(sums.get(row["id"], {"completed": 0, "failed": 0, "cost_usd": None}))
            row["age_s"] = seconds_between(row["created_at"], row.pop("now"))
        return found, (found[-1]["id"] if more else None)

    # -- spend ---------------------------------------------------------------

    def db_clock(self) -> datetime:
        """The database's current time, in UTC (the spend page's hours are the database's)."""
        with reading(self.engine) as conn:
            now = conn.execute(select(db_now())).scalar_one()
        return as_utc(now)

    def spend_between(self, start: datetime, end: datetime, cap: int = SPEND_ROWS) -> tuple[list[dict[str, Any]], bool]:
        """Requests completed in [start, end) through the completion index, summed per (model, job,
        provider, pool): requests, cost, tokens, retries (attempts after the first) and 429s (the
        attempts' partial index of 429s). At most `cap` requests (True when it stopped there)."""
        c, a = requests.c, attempts.c
        done = (
            select(c.id, c.model, c.job_id, c.provider, c.endpoint, c.cost_usd, c.input_tokens, c.output_tokens)
            .add_columns(c.attempts)
            .where(c.completed_at >= start, c.completed_at < end)
            .limit(cap + 1)
            .subquery()
        )
        too_many = select(func.count()).where(a.request_id == done.c.id, a.status_code == TOO_MANY).scalar_subquery()
        keys = (done.c.model, done.c.job_id, done.c.provider, done.c.endpoint)
        query = select(
            *keys,
            func.count().label("requests"),
            func.sum(done.c.cost_usd).label("cost_usd"),
            func.sum(done.c.input_tokens).label("input_tokens"),
            func.sum(done.c.output_tokens).label("output_tokens"),
            func.sum(case((done.c.attempts > 1, done.c.attempts - 1), else_=0)).label("retries"),
            func.sum(too_many).label("too_many"),
        ).group_by(*keys)
        with reading(self.engine) as conn:
            rows = [dict(r._mapping) for r in conn.execute(query)]
        return rows, sum(int(r["requests"]) for r in rows) > cap

    # -- choices for the filter forms ----------------------------------------

    def known_pools(self) -> list[str]:
        """Pools with state of their own (every pool that ever had a call) for the filter form."""
        with reading(self.engine) as conn:
            return [str(e) for e in conn.execute(select(pools.c.endpoint).order_by(pools.c.endpoint)).scalars()]


def _read_pool_state(conn: Connection, found: dict[str, PoolView]) -> None:
    """Each pool's learned limit, cooldown or pause, and window left, into `found` (a pool with
    state but no requests is added)."""
    state = conn.execute(
        select(
            pools.c.endpoint,
            pools.c.learned_limit,
            case((pools.c.cooldown_until > db_now(), pools.c.cooldown_until), else_=None),
            pools.c.paused_reason,
            case((pools.c.window_until > db_now(), pools.c.window_left), else_=None),
        )
    ).all()
    for endpoint, learned, cooling, paused, left in state:
        view = found.setdefault(str(endpoint), PoolView(str(endpoint), Count(0), Count(0)))
        view.learned_limit = learned
        view.cooldown_until = cooling
        view.paused_reason = paused if cooling is not None else None
        view.window_left = left


def _read_window_use(conn: Connection, found: dict[str, PoolView]) -> None:
    """The calls and tokens of each pool of `found` in the current rate window."""
    # Pools with an RPM/TPM cap log their calls (`llm_pool_calls`, the window the claim
    # enforces); the others are read from the newest attempts (calls started in the
    # window) and the completion index (tokens of the answers that came back in it).
    # The window's start is read once and bound: PostgreSQL's clock_timestamp() is volatile,
    # and a comparison with it cannot search an index (it would read every completion).
    a, c = attempts.c, requests.c
    since = as_utc(conn.execute(select(db_now_plus(-RATE_WINDOW_S))).scalar_one())
    # The newest attempts by the primary key, walked backwards with a LIMIT: the one plan there is
    # for this shape. (`id > max - N` was a range the planner sized from statistics: without
    # them it guessed a third of the table and read every attempt.)
    newest = select(a.request_id, a.started_at).order_by(a.id.desc()).limit(RECENT_ATTEMPTS).subquery()
    ids = list(conn.execute(select(newest.c.request_id).where(newest.c.started_at > since)).scalars())
    for chunk in range(0, len(ids), 1000):
        per_pool = select(c.endpoint, func.count()).where(c.id.in_(ids[chunk : chunk + 1000]))
        for endpoint, calls in conn.execute(per_pool.group_by(c.endpoint)):
            if str(endpoint) in found:
                found[str(endpoint)].window_calls += int(calls)
    answered = func.sum(func.coalesce(c.input_tokens, 0) + func.coalesce(c.output_tokens, 0))
    recent = select(c.endpoint, answered).where(c.completed_at > since)
    for endpoint, tokens in conn.execute(recent.group_by(c.endpoint)):
        if str(endpoint) in found:
            found[str(endpoint)].window_tokens += int(tokens or 0)
    capped = conn.execute(
        select(pool_calls.c.endpoint, func.count(), func.coalesce(func.sum(pool_calls.c.tokens), 0))
        .where(pool_calls.c.started_at > db_now_plus(-RATE_WINDOW_S))
        .group_by(pool_calls.c.endpoint)
    ).all()
    for endpoint, calls, tokens in capped:
        if str(endpoint) in found:
            found[str(endpoint)].window_calls = int(calls)
            found[str(endpoint)].window_tokens = int(tokens)


def _next_pool(status: str, after: str | None = None) -> Any:
    """The first pool of `status` (after `after`) in the (status, endpoint) index, as a scalar subquery."""
    c = requests.c
    query = select(func.min(c.endpoint)).where(c.status == status)
    return (query if after is None else query.where(c.endpoint > after)).scalar_subquery()


def _capped(cap: int, *where: ColumnElement[bool]) -> Any:
    """The count of rows matching `where`, up to `cap` + 1 (more than `cap`: capped), as a scalar subquery."""
    inner = select(literal(1).label("one")).where(*where).limit(cap + 1).subquery()
    return select(func.count()).select_from(inner).scalar_subquery()


def _top_id(conn: Connection) -> int | None:
    top = conn.execute(select(func.max(requests.c.id))).scalar_one_or_none()
    return None if top is None else int(top) + 1


def _had_429(low: int, high: int) -> Any:
    a = attempts.c
    return select(a.request_id).where(a.status_code == TOO_MANY, a.request_id >= low, a.request_id < high)
