"""Slots (PostgreSQL): the global limit's, and those of each pool that needs no turn.

`llm_slots` has one row per slot: pool '' for `MAX_CONCURRENT_LLM_CALLS`, an endpoint's name for
its pool's limit, numbered from 1. A claim locks free slots (`holder IS NULL`, numbered up to the
limit it works to) with `FOR UPDATE SKIP LOCKED`, takes at most one request per slot, and writes
each request it starts into its slots in the statement that starts it (`hold`). A trigger on
`llm_requests` (migration 0016) frees them in whichever transaction ends the request's `running`.
So at most `limit` requests hold a slot numbered up to `limit`, whichever claims run side by side,
and no claim waits for another: a slot held by a claim (or an outcome freeing it) is skipped.
SQLite serialises its writers (`Dialect.keeps_slots` is False there): none of this runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Integer, String, bindparam, column, select, text, update
from sqlalchemy.sql.expression import CTE

from ledger.store.row_sets import bound_rows
from ledger.store.tables import slots

GLOBAL = ""  # the pool name of the global limit's slots

# The global limit's free slots, locked as they are read, skipping those another claim holds or
# an outcome is freeing, both until their transaction ends.
FREE_SLOTS = (
    select(slots.c.slot_no)
    .where(slots.c.pool == GLOBAL, slots.c.holder.is_(None), slots.c.slot_no <= bindparam("b_global"))
    .order_by(slots.c.slot_no)
    .limit(bindparam("b_slots"))
    .with_for_update(skip_locked=True)
)
# Each pool's free slots up to its limit, as many as wanted: (pool, lim, want) as one JSON set.
POOL_SLOTS = text(
    "SELECT p.pool, s.slot_no FROM json_to_recordset(CAST(:b_pools AS json)) AS p(pool text, lim int, want int)"
    " CROSS JOIN LATERAL (SELECT slot_no FROM llm_slots WHERE llm_slots.pool = p.pool AND holder IS NULL"
    " AND slot_no <= p.lim ORDER BY slot_no LIMIT p.want FOR UPDATE SKIP LOCKED) AS s"
)
# Slots 1..lim of each (pool, lim), only those missing: a slot a claim in progress holds is a row
# version not committed yet, and an insert that ran into its key would wait for that claim.
MAKE_SLOTS = text(
    "INSERT INTO llm_slots (pool, slot_no)"
    " SELECT p.pool, n FROM json_to_recordset(CAST(:b_pools AS json)) AS p(pool text, lim int),"
    " generate_series(1, p.lim) AS n"
    " WHERE NOT EXISTS (SELECT 1 FROM llm_slots s WHERE s.pool = p.pool AND s.slot_no = n)"
    " ORDER BY 1, 2 ON CONFLICT DO NOTHING"
)
# The slots the rows of a claim take: (request id, pool, slot number).
HOLD = bound_rows("h", "b_hold", column("id", BigInteger), column("pool", String), column("slot_no", Integer))


def hold(taken: CTE) -> CTE:
    """The update that writes each row `taken` really took into its slots (a CTE of the take)."""
    return (
        update(slots)
        .where(slots.c.pool == HOLD.c.pool, slots.c.slot_no == HOLD.c.slot_no, HOLD.c.id.in_(select(taken.c.id)))
        .values(holder=HOLD.c.id)
        .cte("held")
    )


def grab(global_limit: int, global_want: int, pools: Iterable[dict[str, Any]]) -> list[tuple[Any, dict[str, Any]]]:
    """The statements that lock up to `global_want` free global slots and, per (pool, lim, want)
    of `pools`, up to `want` of that pool's free slots numbered up to `lim`."""
    return [
        (FREE_SLOTS, {"b_global": global_limit, "b_slots": max(global_want, 1)}),
        (POOL_SLOTS, {"b_pools": pools_json(pools)}),
    ]


def pools_json(rows: Iterable[dict[str, Any]]) -> str:
    """Rows for `POOL_SLOTS` / `MAKE_SLOTS`' one JSON parameter."""
    return json.dumps(list(rows))


@dataclass
class Grabbed:
    """The slots a claim locked: the global limit's, and each slotted pool's."""

    global_nos: list[int]
    pools: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def read(cls, global_rows: Iterable[Any], pool_rows: Iterable[Any]) -> Grabbed:
        found: dict[str, list[int]] = {}
        for pool, slot_no in pool_rows:
            found.setdefault(str(pool), []).append(int(slot_no))
        return cls([int(n) for (n,) in global_rows], found)

    def pairs(self, picked: list[tuple[int, str]]) -> list[dict[str, Any]]:
        """`HOLD`'s rows for the rows picked (id, pool), in order: each takes the next global slot
        and, in a slotted pool, the next of its pool's."""
        rows: list[dict[str, Any]] = []
        used: dict[str, int] = {}
        for (request_id, pool), global_no in zip(picked, self.global_nos, strict=False):
            rows.append({"id": request_id, "pool": GLOBAL, "slot_no": global_no})
            mine = self.pools.get(pool)
            if mine is not None:
                i = used.get(pool, 0)
                rows.append({"id": request_id, "pool": pool, "slot_no": mine[i]})
                used[pool] = i + 1
        return rows
