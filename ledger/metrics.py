"""Prometheus metrics of a daemon (`ledger daemon --metrics-port N`).

Two kinds, kept apart on purpose:

- What this process did (counters and histograms: calls, attempts, tokens, cost,
  transaction times, leases lost), counted where it happens. The hooks sit on the
  hot path, so they cost a label lookup and an increment; a daemon without a port
  holds `NO_METRICS`, whose hooks do nothing.
- What the ledger holds (gauges: requests per status, queue depth, slots in use,
  limits). Several daemons share one database, so only the database can say these
  truly; each daemon reads them every `LEDGER_METRICS_INTERVAL` seconds in a
  lane of its own and serves the last reading. A scrape never waits on the
  database, and the reading never queues in front of the recorder's commits.

prometheus_client is imported only when metrics are on: the other commands do not
pay for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from ledger.settings import Settings, SettingsError
from ledger.statuses import RequestStatus
from ledger.store.audit import LedgerCounts
from ledger.store.rows import Claim, Completed, Failed, Outcome, Written
from ledger.store.schema import one_line

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.metrics_core import Metric

LOG = logging.getLogger("ledger.metrics")

# LLM calls take from a tenth of a second to minutes (LLM_CALL_TIMEOUT is 120 s by default).
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# A claim or a group commit takes milliseconds; seconds mean lock waits or a struggling database.
TRANSACTION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Attempts that never reached a provider: no call latency to observe.
NOT_CALLED = frozenset({"config_error"})


class Metrics:
    """The hooks the daemon calls. This base does nothing, so metrics off cost a method call."""

    def claimed(self, claim: Claim) -> None:
        """A claim's requests were started (and expired leases of others ended)."""

    def recorded(self, outcomes: Sequence[Outcome], written: Sequence[Written]) -> None:
        """A group of outcomes was committed; `written` says what became of each."""

    def claim_transaction(self) -> AbstractContextManager[object]:
        """Around a claim transaction, in the database lane's thread."""
        return nullcontext()

    def record_transaction(self) -> AbstractContextManager[object]:
        """Around a group commit (with the claim that may ride in it), in the lane's thread."""
        return nullcontext()

    def renewal_lost(self) -> None:
        """A lease renewal failed or did not finish in time."""

    def leases_cut(self, count: int) -> None:
        """Calls cut off because their leases could not be kept."""

    def deadline_fallbacks(self, pool: str, count: int) -> None:
        """Delivery `auto` requests moved from the batch path to online at their deadline."""


NO_METRICS = Metrics()


def _outcome_labels(outcome: Outcome) -> tuple[str, str]:
    """(outcome, status_code) of an attempt: a timeout is its own outcome whether or not it is retried."""
    if isinstance(outcome, Completed):
        return "succeeded", str(outcome.status_code)
    failure = outcome.failure
    code = "none" if failure.status_code is None else str(failure.status_code)
    return ("timeout" if failure.error_code == "timeout" else "failed"), code


def _final_status(outcome: Outcome, written: Written) -> str | None:
    """The status the request ended in, if this outcome ended it."""
    if written is Written.CANCELED:
        return RequestStatus.CANCELED.value
    if written is not Written.APPLIED:
        return None
    if isinstance(outcome, Completed):
        return RequestStatus.COMPLETED.value
    if isinstance(outcome, Failed):
        return RequestStatus.ERROR.value
    return None


@dataclass(frozen=True)
class Reading:
    """The ledger's counts and when they were read (UNIX seconds)."""

    counts: LedgerCounts
    at: float


class PrometheusMetrics(Metrics):
    """One daemon's metrics in a registry of its own (several daemons may share a test process)."""

    def __init__(self, pool_limit: Callable[[str], int], configured_pools: Iterable[str], global_limit: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, ProcessCollector

        self.registry = CollectorRegistry()
        r = self.registry
        self.attempts, self.call_seconds, self.tokens, self.cost = _call_metrics(r)
        self.finished, self.claimed_requests, self.reclaimed = _request_metrics(r)
        self.claim_seconds, self.record_seconds = _transaction_metrics(r)
        self.renewals_lost, self.cut = _lease_metrics(r)
        self.fallbacks = Counter(
            "ledger_deadline_fallbacks",
            "Delivery auto requests this daemon moved from a provider batch (or its queue) online at their deadline.",
            ["pool"],
            registry=r,
        )
        ProcessCollector(registry=r)
        self.ledger = LedgerCollector(pool_limit, configured_pools, global_limit)
        r.register(self.ledger)

    def claimed(self, claim: Claim) -> None:
        for request in claim.requests:
            self.claimed_requests.labels(request.endpoint).inc()
        if claim.reclaimed.requests:
            self.reclaimed.inc(len(claim.reclaimed.requests))

    def recorded(self, outcomes: Sequence[Outcome], written: Sequence[Written]) -> None:
        # Counted whatever the ledger made of the outcome: a call answered after its lease
        # was taken over was still made (and paid for) by this daemon.
        for outcome, w in zip(outcomes, written, strict=True):
            pool = outcome.request.endpoint
            kind, status_code = _outcome_labels(outcome)
            self.attempts.labels(pool, kind, status_code).inc()
            if isinstance(outcome, Completed):
                self.call_seconds.labels(pool).observe(outcome.latency_ms / 1000)
                if outcome.input_tokens:
                    self.tokens.labels(pool, "input").inc(outcome.input_tokens)
                if outcome.output_tokens:
                    self.tokens.labels(pool, "output").inc(outcome.output_tokens)
                if outcome.cost_usd:
                    self.cost.labels(pool).inc(outcome.cost_usd)
            elif outcome.failure.error_code not in NOT_CALLED:
                self.call_seconds.labels(pool).observe(outcome.failure.latency_ms / 1000)
            final = _final_status(outcome, w)
            if final is not None:
                self.finished.labels(pool, final).inc()

    def claim_transaction(self) -> AbstractContextManager[object]:
        return self.claim_seconds.time()

    def record_transaction(self) -> AbstractContextManager[object]:
        return self.record_seconds.time()

    def renewal_lost(self) -> None:
        self.renewals_lost.inc()

    def leases_cut(self, count: int) -> None:
        self.cut.inc(count)

    def deadline_fallbacks(self, pool: str, count: int) -> None:
        self.fallbacks.labels(pool).inc(count)

    async def keep_reading(self, read: Callable[[], Awaitable[LedgerCounts]], interval: float) -> None:
        """Read the ledger's counts now and every `interval` seconds, until cancelled.

        A failed read keeps the last one (its age shows in `ledger_read_age_seconds`)
        and is logged once until a read succeeds again: the daemon's own lanes already
        say loudly when the database is gone.
        """
        failing = False
        while True:
            try:
                counts = await read()
            except Exception as exc:
                if not failing:
                    LOG.warning("could not read the ledger for metrics", extra={"details": {"error": one_line(exc)}})
                failing = True
            else:
                self.ledger.reading = Reading(counts, time.time())
                failing = False
            await anyio.sleep(interval)


def _call_metrics(r: CollectorRegistry) -> tuple[Counter, Histogram, Counter, Counter]:
    """What this daemon's calls did: attempts by outcome, their latency, tokens and cost."""
    from prometheus_client import Counter, Histogram

    attempts = Counter(
        "ledger_attempts",
        "Attempts this daemon made, by how they ended and the provider's HTTP status ('none': no answer).",
        ["pool", "outcome", "status_code"],
        registry=r,
    )
    call_seconds = Histogram(
        "ledger_call_seconds", "Provider call latency per attempt.", ["pool"], buckets=CALL_BUCKETS, registry=r
    )
    tokens = Counter(
        "ledger_tokens",
        "Tokens of the answers this daemon got (input: prompt, output: completion).",
        ["pool", "direction"],
        registry=r,
    )
    cost = Counter(
        "ledger_cost_usd",
        "Cost of the answered calls, from the price table (unpriced models add 0).",
        ["pool"],
        registry=r,
    )
    return attempts, call_seconds, tokens, cost


def _request_metrics(r: CollectorRegistry) -> tuple[Counter, Counter, Counter]:
    """The requests this daemon finished, claimed, and took back from dead daemons."""
    from prometheus_client import Counter

    finished = Counter(
        "ledger_requests_finished",
        "Requests this daemon brought to a final status.",
        ["pool", "status"],
        registry=r,
    )
    claimed_requests = Counter(
        "ledger_requests_claimed", "Requests this daemon claimed (took a slot for).", ["pool"], registry=r
    )
    reclaimed = Counter(
        "ledger_requests_reclaimed",
        "Expired leases of other (dead) daemons this daemon's claims ended.",
        registry=r,
    )
    return finished, claimed_requests, reclaimed


def _transaction_metrics(r: CollectorRegistry) -> tuple[Histogram, Histogram]:
    """How long this daemon's claim transactions and group commits took."""
    from prometheus_client import Histogram

    claim_seconds = Histogram(
        "ledger_claim_transaction_seconds",
        "Claim transactions run on their own (a claim riding in a group commit is in the record one).",
        buckets=TRANSACTION_BUCKETS,
        registry=r,
    )
    record_seconds = Histogram(
        "ledger_record_transaction_seconds",
        "Group commits of outcomes, with the claim that refills the freed slots.",
        buckets=TRANSACTION_BUCKETS,
        registry=r,
    )
    return claim_seconds, record_seconds


def _lease_metrics(r: CollectorRegistry) -> tuple[Counter, Counter]:
    """Leases this daemon could not keep: renewals lost, calls cut off."""
    from prometheus_client import Counter

    renewals_lost = Counter(
        "ledger_lease_renewals_lost", "Lease renewals that failed or did not finish in time.", registry=r
    )
    cut = Counter("ledger_leases_cut", "Calls cut off because their leases could not be kept.", registry=r)
    return renewals_lost, cut


class LedgerCollector:
    """The gauges read from the ledger, served from the last reading (never a query per scrape)."""

    def __init__(self, pool_limit: Callable[[str], int], configured_pools: Iterable[str], global_limit: int) -> None:
        self._pool_limit = pool_limit
        self._configured = sorted(configured_pools)
        self._global_limit = global_limit
        self.reading: Reading | None = None  # replaced whole by the reader: a scrape sees one reading

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "ledger_global_limit", "MAX_CONCURRENT_LLM_CALLS: slots across every pool and daemon.", self._global_limit
        )
        reading = self.reading
        if reading is None:
            return
        counts = reading.counts
        by_pool: dict[str, dict[str, int]] = {}
        for (pool, status), n in counts.requests.items():
            by_pool.setdefault(pool, {})[status] = n
        pools = sorted(set(by_pool) | set(self._configured) | set(counts.learned_limits))
        yield _requests_by_status(by_pool)
        yield from self._pool_gauges(counts, by_pool, pools)
        yield _cache_hits(counts, pools)
        yield GaugeMetricFamily(
            "ledger_read_age_seconds",
            "Seconds since the ledger gauges were read from the database.",
            max(0.0, time.time() - reading.at),
        )

    def _pool_gauges(
        self, counts: LedgerCounts, by_pool: dict[str, dict[str, int]], pools: list[str]
    ) -> Iterator[Metric]:
        """Each pool's queue depth, slots in use, and limits (configured and learned)."""
        from prometheus_client.core import GaugeMetricFamily

        due = GaugeMetricFamily(
            "ledger_queue_depth",
            "Online requests queued and due now: waiting only for a slot (back-offs not counted).",
            labels=["pool"],
        )
        in_flight = GaugeMetricFamily(
            "ledger_pool_in_flight", "Slots in use in the pool, across every daemon.", labels=["pool"]
        )
        limits = GaugeMetricFamily(
            "ledger_pool_limit",
            "The pool's slots: configured (LEDGER_POOL_LIMITS, capped by the global limit) and, after 429s, learned.",
            labels=["pool", "kind"],
        )
        for pool in pools:
            due.add_metric([pool], counts.due.get(pool, 0))
            in_flight.add_metric([pool], by_pool.get(pool, {}).get(RequestStatus.RUNNING.value, 0))
            limits.add_metric([pool, "configured"], self._pool_limit(pool))
            learned = counts.learned_limits.get(pool)
            if learned is not None:
                limits.add_metric([pool, "learned"], learned)
        yield due
        yield in_flight
        yield limits


def _requests_by_status(by_pool: dict[str, dict[str, int]]) -> Metric:
    """Requests per pool and status, every status listed for every pool that has any."""
    from prometheus_client.core import GaugeMetricFamily

    requests = GaugeMetricFamily(
        "ledger_requests", "Requests in the ledger by status (every daemon's, all time).", labels=["pool", "status"]
    )
    for pool in sorted(by_pool):
        for status in RequestStatus:
            requests.add_metric([pool, status.value], by_pool[pool].get(status.value, 0))
    return requests


def _cache_hits(counts: LedgerCounts, pools: list[str]) -> Metric:
    """Requests answered from the response cache, per pool."""
    from prometheus_client.core import CounterMetricFamily

    # Counted by the database (every daemon's and every enqueue's hits alike): a counter that
    # only grows, as the rows it counts are never deleted.
    hits = CounterMetricFamily(
        "ledger_cache_hits",
        "Requests answered from the response cache, with no provider call (every process's, all time).",
        labels=["pool"],
    )
    for pool in sorted(set(pools) | set(counts.cache_hits)):
        hits.add_metric([pool], counts.cache_hits.get(pool, 0))
    return hits


@dataclass(frozen=True)
class ServedMetrics:
    """A daemon's metrics and the HTTP server (a thread of its own) that serves them."""

    metrics: PrometheusMetrics
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    @property
    def url(self) -> str:
        host = str(self.server.server_address[0])
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (waits up to the server's half-second poll)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(settings: Settings) -> ServedMetrics | None:
    """Start serving metrics if a port is configured (None otherwise: nothing listens)."""
    if settings.metrics_port is None:
        return None
    metrics = PrometheusMetrics(settings.pool_limit, settings.pool_limits, settings.max_concurrent_llm_calls)
    from prometheus_client import start_http_server

    try:
        server, thread = start_http_server(settings.metrics_port, settings.metrics_host, registry=metrics.registry)
    except OSError as exc:  # port taken, address not ours: the operator's to fix, in one line
        where = f"{settings.metrics_host}:{settings.metrics_port}"
        raise SettingsError(f"LEDGER_METRICS_PORT: cannot serve metrics on {where}: {exc.strerror or exc}") from None
    return ServedMetrics(metrics, server, thread)
