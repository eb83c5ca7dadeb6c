"""Spend over time without summing a month of requests on every view.

An hour that has ended gains no completions (a request's `completed_at` is the database's clock
when it finished), so its sums are worked out once, by a background thread of the server
(`SpendHours.fill`), and kept here; a view sums only the current hour and reads the rest. Kept
hours are summed again after `KEEP_S` (a price corrected with SQL changes past costs), but only
while someone looks at the page: an idle server does not re-read a month every 15 minutes. Until
the thread has reached an hour, the page says how many hours are still being summed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ledger.store import Store

LOG = logging.getLogger("ledger.web")
HOUR = timedelta(hours=1)
# How far back the page reaches: two days by hour, thirty by day.
WINDOWS = {"hour": 48, "day": 30 * 24}
KEEP_S = 900.0
PAUSE_S = 0.02  # between two hours summed in the background: the daemons' database first


@dataclass(frozen=True)
class Hour:
    rows: list[dict[str, Any]]
    partial: bool
    at: float  # time.monotonic() when summed


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


class SpendHours:
    """The ended hours' sums, filled in the background; the current hour summed on each view."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.hours: dict[datetime, Hour] = {}
        self.lock = threading.Lock()
        self.viewed_at = float("-inf")  # time.monotonic() of the last view

    def fill(self, stop: threading.Event, hours: int = WINDOWS["day"]) -> None:
        """Sum every ended hour of the last `hours` that is missing or stale, newest first; then
        wait and look again. Runs in a thread for the server's life: a first pass at start, then
        only while someone has looked at the spend page in the last `KEEP_S` seconds. A database
        that fails it (gone, restarting) costs one warning a pass, none once the server stops."""
        first = True
        while not stop.is_set():
            if not first and time.monotonic() - self.viewed_at > KEEP_S:
                stop.wait(30.0)  # nobody looks at spend: an idle server asks the database nothing
                continue
            first = False
            try:
                self.sum_hours(stop, hours)
            except Exception as exc:  # the page says which hours are missing; try again later
                if stop.is_set():
                    return
                said = str(exc).strip().splitlines() or [type(exc).__name__]
                LOG.warning("ledger web: spend not summed (again in 30 s): %s", said[0])
            stop.wait(30.0)

    def sum_hours(self, stop: threading.Event, hours: int) -> None:
        """One pass: the ended hours missing or stale, newest first, until `stop`."""
        current = hour_of(self.store.db_clock())
        for back in range(1, hours + 1):
            if stop.is_set():
                return
            start = current - HOUR * back
            kept = self.hours.get(start)
            if kept is not None and time.monotonic() - kept.at < KEEP_S:
                continue
            rows, partial = self.store.spend_between(start, start + HOUR)
            with self.lock:
                self.hours[start] = Hour(rows, partial, time.monotonic())
                for old in [h for h in self.hours if h < current - HOUR * hours]:
                    del self.hours[old]
            stop.wait(PAUSE_S)

    def view(self, unit: str) -> dict[str, Any]:
        """The page's tables: per bucket (hour or day, newest first) by model, job and provider,
        429s and retries per pool, totals, and how many hours are not summed yet."""
        self.viewed_at = time.monotonic()
        current = hour_of(self.store.db_clock())
        rows, partial = self.store.spend_between(current, current + HOUR)
        hours = [(current, rows, partial)]
        missing = 0
        with self.lock:
            for back in range(1, WINDOWS[unit] + 1):
                start = current - HOUR * back
                kept = self.hours.get(start)
                if kept is None:
                    missing += 1
                else:
                    hours.append((start, kept.rows, kept.partial))
        labelled = []
        for start, found, cut in hours:
            label = start.strftime("%Y-%m-%d %H:00") if unit == "hour" else start.strftime("%Y-%m-%d")
            labelled += [{**row, "bucket": label} for row in found]
            partial = partial or cut
        tables = {by: pivot(labelled, by) for by in ("model", "job_id", "provider")}
        totals: dict[str, float] = defaultdict(float)
        for row in labelled:
            for key in ("requests", "cost_usd", "input_tokens", "output_tokens"):
                totals[key] += float(row[key] or 0)
        trouble = pivot(labelled, "endpoint")
        return {
            "unit": unit,
            "tables": tables,
            "trouble": [r for r in trouble if r["retries"] or r["too_many"]],
            "totals": totals,
            "missing": missing,
            "capped": partial,
        }


def pivot(rows: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Rows summed per (bucket, `by`), newest bucket first, each with its share of the largest cost."""
    sums: dict[tuple[str, str], dict[str, Any]] = {}
    fields = ("requests", "cost_usd", "input_tokens", "output_tokens", "retries", "too_many")
    for row in rows:
        key = (str(row["bucket"]), "" if row[by] is None else str(row[by]))
        found = sums.setdefault(key, {"bucket": key[0], "key": key[1], **dict.fromkeys(fields, 0)})
        for name in fields:
            found[name] += row[name] or 0
    out = sorted(sums.values(), key=lambda r: (r["bucket"], r["key"]), reverse=True)
    top = max((float(r["cost_usd"]) for r in out), default=0.0)
    for r in out:
        r["share"] = round(100 * float(r["cost_usd"]) / top) if top else 0
    return out
