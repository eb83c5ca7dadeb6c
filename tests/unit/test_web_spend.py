"""The spend page's hours: each ended hour summed once (by the background pass), the current hour
on every view, days as sums of hours, and nothing read again while nobody looks."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger.web.spend import HOUR, SpendHours

NOW = datetime(2026, 11, 27, 18, 30, tzinfo=UTC)


class FakeStore:
    """One request of $1 per hour, with one retry and one 429 every hour."""

    def __init__(self) -> None:
        self.asked: list[datetime] = []

    def db_clock(self) -> datetime:
        return NOW

    def spend_between(self, start: datetime, end: datetime, cap: int = 0) -> tuple[list[dict[str, Any]], bool]:
        assert end - start == HOUR
        self.asked.append(start)
        row = {"model": "m", "job_id": "j", "provider": "p", "endpoint": "p:m", "requests": 1}
        row.update(cost_usd=1.0, input_tokens=10, output_tokens=5, retries=1, too_many=1)
        return [row], False


def test_each_ended_hour_is_summed_once_and_days_add_them_up() -> None:
    store = FakeStore()
    hours = SpendHours(store)  # type: ignore[arg-type]
    before = hours.view("hour")
    assert before["missing"] == 48 and before["totals"]["requests"] == 1  # the current hour only
    stop = threading.Event()
    store.asked.clear()
    thread = threading.Thread(target=hours.fill, args=(stop, 72))
    thread.start()
    deadline = datetime.now() + timedelta(seconds=20)
    while len(hours.hours) < 72 and datetime.now() < deadline:
        threading.Event().wait(0.01)
    stop.set()
    thread.join()
    assert len(store.asked) == len(set(store.asked)) == 72  # every ended hour once
    by_hour = hours.view("hour")
    assert by_hour["missing"] == 0 and by_hour["totals"]["cost_usd"] == 49.0
    days = {r["bucket"]: r["cost_usd"] for r in hours.view("day")["tables"]["model"]}
    assert days["2026-11-27"] == 19.0  # hours 00:00 to 18:00 of today
    trouble = hours.view("hour")["trouble"]
    assert trouble[0]["key"] == "p:m" and trouble[0]["too_many"] == 1 and trouble[0]["retries"] == 1
