"""The metrics hooks and the ledger gauges, without a daemon (the daemon's own test scrapes a real one)."""

from __future__ import annotations

import time

from ledger.metrics import PrometheusMetrics, Reading
from ledger.store.audit import LedgerCounts
from ledger.store.rows import AttemptFailure, ClaimedRequest, Completed, Failed, Outcome, RetryLater, Written

POOL = "openai:gpt-4o-mini"


def request(i: int) -> ClaimedRequest:
    return ClaimedRequest(i, 1, 1, f"k{i}", None, "openai", "gpt-4o-mini", POOL, {"messages": []}, {}, None, {})


def metrics() -> PrometheusMetrics:
    return PrometheusMetrics(lambda pool: 3 if pool == "http:gpu:8000" else 5, ["http:gpu:8000"], 8)


def test_each_outcome_counts_as_its_attempt_and_only_calls_have_a_latency() -> None:
    m = metrics()
    outcomes: list[Outcome] = [
        Completed(request(1), 1, "ok", 250, input_tokens=10, output_tokens=4, cost_usd=0.5),
        RetryLater(request(2), 1, AttemptFailure(None, "timeout", "no answer", 2000), delay_s=1.0, hold_slot=False),
        Failed(request(3), 1, AttemptFailure(None, "config_error", "no base URL", 0)),
        Completed(request(4), 2, "late", 100, input_tokens=3, output_tokens=1),
    ]
    m.recorded(outcomes, [Written.APPLIED, Written.APPLIED, Written.APPLIED, Written.REFUSED])
    value = m.registry.get_sample_value
    assert value("ledger_attempts_total", {"pool": POOL, "outcome": "succeeded", "status_code": "200"}) == 2
    assert value("ledger_attempts_total", {"pool": POOL, "outcome": "timeout", "status_code": "none"}) == 1
    assert value("ledger_attempts_total", {"pool": POOL, "outcome": "failed", "status_code": "none"}) == 1
    assert value("ledger_call_seconds_count", {"pool": POOL}) == 3  # the config error made no call
    assert value("ledger_call_seconds_sum", {"pool": POOL}) == 2.35
    # A refused answer (the lease was taken over) was still paid for; it finished nothing here.
    assert value("ledger_tokens_total", {"pool": POOL, "direction": "input"}) == 13
    assert value("ledger_cost_usd_total", {"pool": POOL}) == 0.5
    assert value("ledger_requests_finished_total", {"pool": POOL, "status": "completed"}) == 1
    assert value("ledger_requests_finished_total", {"pool": POOL, "status": "error"}) == 1


def test_ledger_gauges_wait_for_a_reading_then_cover_every_known_pool() -> None:
    m = metrics()
    value = m.registry.get_sample_value
    assert value("ledger_global_limit") == 8
    assert value("ledger_pool_limit", {"pool": "http:gpu:8000", "kind": "configured"}) is None  # nothing read yet
    counts = LedgerCounts({(POOL, "running"): 2, (POOL, "queued"): 7}, {POOL: 4}, {POOL: 2})
    m.ledger.reading = Reading(counts, time.time())
    assert value("ledger_requests", {"pool": POOL, "status": "queued"}) == 7
    assert value("ledger_requests", {"pool": POOL, "status": "error"}) == 0
    assert value("ledger_queue_depth", {"pool": POOL}) == 4
    assert value("ledger_pool_in_flight", {"pool": POOL}) == 2
    assert value("ledger_pool_limit", {"pool": POOL, "kind": "configured"}) == 5
    assert value("ledger_pool_limit", {"pool": POOL, "kind": "learned"}) == 2
    # A configured pool with no requests yet is still shown: idle, at its limit.
    assert value("ledger_pool_in_flight", {"pool": "http:gpu:8000"}) == 0
    assert value("ledger_pool_limit", {"pool": "http:gpu:8000", "kind": "configured"}) == 3
    assert value("ledger_pool_limit", {"pool": "http:gpu:8000", "kind": "learned"}) is None


def test_deadline_fallbacks_are_counted_per_pool() -> None:
    m = metrics()
    m.deadline_fallbacks(POOL, 3)
    m.deadline_fallbacks(POOL, 2)
    m.deadline_fallbacks("anthropic:claude-haiku-4-5", 1)
    value = m.registry.get_sample_value
    assert value("ledger_deadline_fallbacks_total", {"pool": POOL}) == 5
    assert value("ledger_deadline_fallbacks_total", {"pool": "anthropic:claude-haiku-4-5"}) == 1
