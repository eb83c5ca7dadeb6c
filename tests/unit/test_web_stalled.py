"""The overview's one line on why queued work does not move: the first reason that holds, in the
order an operator would check them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ledger.store.browse import Count, PoolView
from ledger.web.pages_overview import pool_state, why_stalled


def web(budget: float | None = None) -> Any:
    return SimpleNamespace(settings=SimpleNamespace(daily_budget_usd=budget))


def row(*, queued: int = 3, running: int = 0, limit: int = 2, **state: Any) -> dict[str, Any]:
    view = PoolView("openai:gpt-4o", Count(running), Count(queued), **state)
    return {"view": view, "limit": limit, "state": pool_state(view, window_spent=False)}


def test_why_queued_work_does_not_move() -> None:
    assert why_stalled(web(), [row()], daemons=0, spent=None).startswith("no daemon heard from")
    assert "budget is spent" in why_stalled(web(budget=1.0), [row()], daemons=1, spent=1.5)
    paused = row(paused_reason="insufficient_quota", cooldown_until="2026-11-28 00:00")
    assert why_stalled(web(), [paused], daemons=1, spent=None) == "paused: openai:gpt-4o"
    cooling = row(cooldown_until="2026-11-27 19:00")
    assert why_stalled(web(), [cooling], daemons=1, spent=None) == "in cooldown: openai:gpt-4o"
    assert why_stalled(web(), [row(window_left=0)], daemons=1, spent=None) == "rate window spent: openai:gpt-4o"
    assert why_stalled(web(), [row(running=2)], daemons=1, spent=None) == "pool full: openai:gpt-4o"
    assert "not due yet" in why_stalled(web(), [row()], daemons=1, spent=None)
