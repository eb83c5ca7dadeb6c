"""The SQL of an enqueue written in short transactions (`ledger.intake` drives it).

A chunk of validated rows (tuples in `CHUNK_ROW_COLUMNS` order, JSON columns as text, made
before the transaction starts) goes in with one set-based `INSERT ... SELECT` that skips keys
already there (`ON CONFLICT (idempotency_key) DO NOTHING`), by the dialect's fastest
multi-row path (`Dialect.insert_rows`): PostgreSQL COPYs the chunk into a temporary
staging table and inserts from it; SQLite, in-process, reads a multi-row VALUES. A row whose
question has a source in the response cache is written answered by that insert
(`cache.answered_at_insert`); the others go through `cache.resolve` for twins.
On SQLite the file's one write lock is held only while the database works.

Keys the insert skipped were already there; inside the same transaction their stored
body hashes are compared with the chunk's, and a different body aborts the chunk
(`KeyConflict`) with nothing of it written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, true
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.selectable import NamedFromClause

from ledger.fingerprint import BODY_FIELDS, body_hash
from ledger.models import Job, LlmRequest
from ledger.store.cache import NOTHING_RESOLVED, CachePolicy, Hit, Resolved, answered_at_insert, resolve
from ledger.store.commit import reading, transaction
from ledger.store.dialect import Dialect, db_now
from ledger.store.lineage import link_sources
from ledger.store.queue import max_fair_seq, queued_count

requests = LlmRequest.__table__  # type: ignore[attr-defined]
jobs = Job.__table__  # type: ignore[attr-defined]

# What a chunk's rows carry, in this order (from `ledger.enqueue.checked_row`, plus fair_seq);
# the other columns take their defaults, and the timestamps the database clock.
CHUNK_ROW_COLUMNS = (
    "fair_seq",
    "idempotency_key",
    *BODY_FIELDS,
    "batch_key",
    "body_hash",
    "priority",
    "estimate_usd",
    "token_estimate",
    "api",
    "parse",
    "sources",
    "cache_key",
    "sample",
    "use_cache",
    "dropped_params",
    "deadline",  # delivery `auto` only (as text: `ledger.deadlines.deadline_text`)
)
_KEY_AT, _SOURCES_AT = CHUNK_ROW_COLUMNS.index("idempotency_key"), CHUNK_ROW_COLUMNS.index("sources")
_KNOWN = select(requests.c.id, requests.c.idempotency_key, requests.c.body_hash).where(
    requests.c.idempotency_key.in_(bindparam("b_keys", expanding=True))
)
_BODIES = select(
    requests.c.id, *[requests.c[f] for f in BODY_FIELDS], requests.c.api, requests.c.parse, requests.c.sources
).where(requests.c.id.in_(bindparam("b_ids", expanding=True)))
# Keys per lookup: far below both databases' limits on bound parameters.
KEYS_PER_LOOKUP = 1000


@dataclass(frozen=True)
class Known:
    """A key already in the ledger: its request, and the hash of the body stored under it."""

    request_id: int
    body_hash: str


class KeyConflict(Exception):
    """A key already in the ledger with a different body; the chunk was rolled back."""

    def __init__(self, key: str, request_id: int) -> None:
        super().__init__(f"key {key!r} is already in the ledger (request {request_id}) with a different body")
        self.key = key
        self.request_id = request_id


@dataclass(frozen=True)
class ChunkWritten:
    inserted: list[tuple[int, str]]  # (id, key) of each new row
    repeats: int  # keys that were already there with the same body
    cache: Resolved = NOTHING_RESOLVED  # what the response cache did for the new rows


class IntakeQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    def known_keys(self, keys: list[str]) -> dict[str, Known]:
        """Which of `keys` the ledger holds (one short read per KEYS_PER_LOOKUP keys)."""
        found: dict[str, Known] = {}
        with reading(self.engine) as conn:
            for i in range(0, len(keys), KEYS_PER_LOOKUP):
                found |= _known(conn, keys[i : i + KEYS_PER_LOOKUP])
        return found

    def stored_body(self, request_id: int) -> dict[str, Any]:
        """A request's body fields as stored (to name what a conflict differs in)."""
        with reading(self.engine) as conn:
            return dict(conn.execute(_BODIES, {"b_ids": [request_id]}).one()._mapping)

    def next_fair_seqs(self, job_ids: Iterable[str | None]) -> dict[str | None, int]:
        """Per job, the `fair_seq` its next request gets: read once per enqueue, then counted
        on by the caller (the column orders claims fairly; it need not be unique)."""
        with reading(self.engine) as conn:
            return {job_id: max_fair_seq(conn, job_id) + 1 for job_id in job_ids}

    def insert_chunk(
        self,
        rows: list[tuple[Any, ...]],
        hashes: dict[str, str],
        job_ids: set[str],
        cache: CachePolicy | None = None,
    ) -> ChunkWritten:
        """One transaction: the chunk's jobs (if new), its rows (keys already there skipped), for
        each skipped key the check that its stored body is the same (else `KeyConflict`), and
        with a `cache` policy the new rows answered from the response cache where they can be.

        `rows` are tuples in `CHUNK_ROW_COLUMNS` order; `hashes` maps each of their keys (unique
        within the chunk) to its body hash.
        """
        with transaction(self.engine, self.dialect) as conn:
            for job_id in sorted(job_ids):
                conn.execute(self.dialect.insert_ignore(jobs, ["id"]), {"id": job_id, "status": "running"})
            written = self.dialect.insert_rows(
                conn, requests, CHUNK_ROW_COLUMNS, rows, lambda s: _insert_answering(conn, s, cache)
            )
            new = [(int(rid), str(key)) for rid, key, _, _ in written]
            hits = [Hit(int(rid), int(src), str(pool)) for rid, _, src, pool in written if src is not None]
            if any(row[_SOURCES_AT] not in (None, "null") for row in rows):
                sources = {row[_KEY_AT]: json.loads(row[_SOURCES_AT]) for row in rows if row[_SOURCES_AT] is not None}
                link_sources(conn, ((rid, sources.get(key)) for rid, key in new))
            added = {key for _, key in new}
            skipped = [key for key in hashes if key not in added]
            if skipped:
                known = _known(conn, skipped)
                for key in skipped:
                    if known[key].body_hash != hashes[key]:
                        raise KeyConflict(key, known[key].request_id)
            answered = {hit.request_id for hit in hits}
            resolved = resolve(conn, self.dialect, [rid for rid, _ in new if rid not in answered], cache)
        return ChunkWritten(new, len(skipped), Resolved(hits + resolved.hits, resolved.twins))

    def queue_depth(self) -> int:
        with reading(self.engine) as conn:
            return queued_count(conn)


def _insert_answering(conn: Connection, s: NamedFromClause, cache: CachePolicy | None) -> str:
    """The chunk's INSERT ... SELECT from `s` (`Dialect.insert_rows`): keys already there skipped,
    the clock columns at the database's now, and each request with a source in the response
    cache written answered from it (`answered_at_insert`). Returns (id, key, source, pool) of
    each row written. Made once per database and cache age (the text is the same for every chunk)."""
    age = None if cache is None else cache.age_seconds
    key = (conn.dialect.name, str(s), age)
    found = _INSERTS.get(key)
    if found is None:
        new, joined, answer = answered_at_insert(s, cache)
        now = db_now()
        picked = {**{c: new.c[c] for c in CHUNK_ROW_COLUMNS}, **{c: now for c in _CLOCK}, **answer}
        query = select(*picked.values()).select_from(joined).where(true()).order_by(new.c.ord)
        compiled = query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        found = _INSERTS[key] = (
            f"INSERT INTO {requests.name} ({', '.join(picked)}) {compiled}"
            " ON CONFLICT (idempotency_key) DO NOTHING"
            f" RETURNING id, idempotency_key, cached_from, endpoint"
        )
    return found


# The clock columns a new request takes from the database's now.
_CLOCK = ("created_at", "updated_at", "next_attempt_at")
# `_insert_answering`'s statements, by (database, relation, cache age).
_INSERTS: dict[tuple[str, str, float | None], str] = {}


def _known(conn: Connection, keys: list[str]) -> dict[str, Known]:
    rows = conn.execute(_KNOWN, {"b_keys": keys}).all()
    older = [r.id for r in rows if r.body_hash is None]  # enqueued before migration 0005
    hashed = {r.id: body_hash(dict(r._mapping)) for r in conn.execute(_BODIES, {"b_ids": older})} if older else {}
    return {r.idempotency_key: Known(int(r.id), r.body_hash or hashed[r.id]) for r in rows}
