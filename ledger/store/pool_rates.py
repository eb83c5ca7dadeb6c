"""RPM / TPM caps: the calls a capped pool started, logged in `llm_pool_calls`, and counted over
its window (a minute, or a window learned from a 429, `pool_windows`).

`PoolRules` says which pools are capped and over what window; a claim asks it (through
`pools.PoolRoom`) whether a pool's window has room, and logs the calls it starts here. Split
from `pools.py`, which holds what a claim may start; this module holds the caps' own log.
Called only from `Store` methods, inside their transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from sqlalchemy import bindparam, delete, func, insert, select
from sqlalchemy.engine import Connection

from ledger.models import LlmPoolCall, LlmRequest
from ledger.prices import DEFAULT_MAX_OUTPUT_TOKENS
from ledger.store.dialect import db_now, db_now_plus
from ledger.store.pool_windows import LearnedWindow
from ledger.store.rows import ClaimedRequest

requests = LlmRequest.__table__  # type: ignore[attr-defined]
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

WINDOW_USE = (
    select(calls.c.endpoint, func.count(), func.coalesce(func.sum(calls.c.tokens), 0))
    .where(
        calls.c.endpoint.in_(bindparam("b_pools", expanding=True)),
        calls.c.started_at > db_now_plus(bindparam("b_since")),
    )
    .group_by(calls.c.endpoint)
)


def reserved_tokens(estimate: int | None) -> int:
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
        log_calls(conn, [(request.endpoint, request.id, attempt, reserved_tokens(estimate))], rules)


def window_full(conn: Connection, endpoint: str, rules: PoolRules) -> bool:
    """A capped pool with no call left in its window (a held retry must not start one)."""
    if not rules.capped(endpoint):
        return False
    params = {"b_pools": [endpoint], "b_since": -rules.window_of(endpoint)}
    row = conn.execute(WINDOW_USE, params).first()
    n, tokens = (int(row[1]), int(row[2])) if row else (0, 0)
    return rules.spent(endpoint, n, tokens)
