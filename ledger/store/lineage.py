"""Lineage: which requests a request was built from (`sources`), both ways, and the walk back.

A request names its sources when it is enqueued (`sources=[ids]`); the list is kept on the row
as given and indexed both ways in `llm_request_sources` (one row per source, an index on
`source_id`), written in the transaction that inserts the request. The walk from a result back
to everything behind it is one recursive query, the same on both databases (`LINEAGE`, also in
docs/pipelines.md for hand-written audits).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, text
from sqlalchemy.engine import Connection, Engine

from ledger.store.commit import reading
from ledger.store.tables import request_sources, requests

_EXISTING = select(requests.c.id).where(requests.c.id.in_(bindparam("b_ids", expanding=True)))
# Everything a request was built from, however far back: (id, depth), depth 1 its own sources.
LINEAGE = text(
    """
WITH RECURSIVE lineage(id, depth) AS (
    SELECT source_id, 1 FROM llm_request_sources WHERE request_id = :request_id
    UNION
    SELECT s.source_id, l.depth + 1
    FROM llm_request_sources s JOIN lineage l ON s.request_id = l.id
    WHERE l.depth < 100
)
SELECT r.id, MIN(l.depth) AS depth, r.idempotency_key, r.purpose, r.status, r.model
FROM lineage l JOIN llm_requests r ON r.id = l.id
GROUP BY r.id, r.idempotency_key, r.purpose, r.status, r.model
ORDER BY MIN(l.depth), r.id
"""
)


def link_sources(conn: Connection, new: Iterable[tuple[int, Sequence[int] | None]]) -> None:
    """Index the sources of newly inserted requests (request id, its sources), in the caller's transaction."""
    links = [{"request_id": rid, "source_id": int(s)} for rid, sources in new for s in dict.fromkeys(sources or ())]
    if links:
        conn.execute(insert(request_sources), links)


class LineageQueries:
    """Mixed into `Store`; needs `engine`."""

    engine: Engine

    def missing_requests(self, ids: Iterable[int]) -> list[int]:
        """The ids among `ids` that name no request (a source must exist when it is named)."""
        wanted = sorted(set(ids))
        if not wanted:
            return []
        with reading(self.engine) as conn:
            found = set(conn.execute(_EXISTING, {"b_ids": wanted}).scalars())
        return [i for i in wanted if i not in found]

    def sources_of(self, request_id: int) -> dict[str, list[int]]:
        """`sources`: the requests this one was built from; `built_from_it`: those built from it."""
        c = request_sources.c
        with reading(self.engine) as conn:
            sources = conn.execute(select(c.source_id).where(c.request_id == request_id).order_by(c.source_id))
            derived = conn.execute(select(c.request_id).where(c.source_id == request_id).order_by(c.request_id))
            return {"sources": list(sources.scalars()), "built_from_it": list(derived.scalars())}

    def lineage(self, request_id: int) -> list[dict[str, Any]]:
        """Every request behind `request_id`, nearest first (`depth` 1: its own sources)."""
        with reading(self.engine) as conn:
            return [dict(row._mapping) for row in conn.execute(LINEAGE, {"request_id": request_id})]
