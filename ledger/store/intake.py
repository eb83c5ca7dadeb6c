"""The SQL of an enqueue written in short transactions (`ledger.intake` drives it).

A chunk of validated rows is one JSON parameter used as a table (`dialect.json_rows`:
PostgreSQL's `json_to_recordset`, SQLite's `json_each`) and goes in with one
set-based `INSERT ... SELECT ... ON CONFLICT (idempotency_key) DO NOTHING`: one
statement, one round trip, its parameter built before the transaction starts, so on
SQLite the file's one write lock is held only while the database works.

Keys the insert skipped were already there; inside the same transaction their stored
body hashes are compared with the chunk's, and a different body aborts the chunk
(`KeyConflict`) with nothing of it written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, Float, Integer, String, bindparam, column, func, select, true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine

from ledger.fingerprint import BODY_FIELDS, body_hash
from ledger.models import Job, LlmRequest, RequestStatus
from ledger.store.commit import transaction
from ledger.store.dialect import Dialect, db_now, json_rows

requests = LlmRequest.__table__  # type: ignore[attr-defined]
jobs = Job.__table__  # type: ignore[attr-defined]

# What a chunk's JSON carries per row (ledger.enqueue.to_row, plus fair_seq); the rest is the
# columns' defaults and the database clock.
STAGED_COLUMNS = (
    column("idempotency_key", String()),
    column("job_id", String()),
    column("fair_seq", BigInteger()),
    column("purpose", String()),
    column("provider", String()),
    column("model", String()),
    column("endpoint", String()),
    column("input", JSONB()),
    column("params", JSONB()),
    column("response_format", JSONB()),
    column("batch_key", String()),
    column("body_hash", String()),
    column("delivery", String()),
    column("priority", Integer()),
    column("trace", JSONB()),
    column("estimate_usd", Float()),
)
COLUMN_NAMES = tuple(c.name for c in STAGED_COLUMNS)
_STAGED = json_rows("staged", "b_rows", *STAGED_COLUMNS)
_CLOCK = ("created_at", "updated_at", "next_attempt_at")


def _insert_chunk(dialect: str) -> Any:
    """`WHERE true`: SQLite's parser needs it between `INSERT ... SELECT` and `ON CONFLICT`."""
    picked = select(*[_STAGED.c[name] for name in COLUMN_NAMES], db_now(), db_now(), db_now()).where(true())
    return (
        Dialect(dialect)
        .insert_ignore(requests, ["idempotency_key"])
        .from_select([*COLUMN_NAMES, *_CLOCK], picked)
        .returning(requests.c.id, requests.c.idempotency_key)
    )


_INSERT_CHUNK = {name: _insert_chunk(name) for name in ("postgresql", "sqlite")}
_KNOWN = select(requests.c.id, requests.c.idempotency_key, requests.c.body_hash).where(
    requests.c.idempotency_key.in_(bindparam("b_keys", expanding=True))
)
_BODIES = select(requests.c.id, *[requests.c[f] for f in BODY_FIELDS]).where(
    requests.c.id.in_(bindparam("b_ids", expanding=True))
)
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


class IntakeQueries:
    """Mixed into `Store`; needs `engine` and `dialect`."""

    engine: Engine
    dialect: Dialect

    def known_keys(self, keys: list[str]) -> dict[str, Known]:
        """Which of `keys` the ledger holds (one short read per KEYS_PER_LOOKUP keys)."""
        found: dict[str, Known] = {}
        with self.engine.connect() as conn:
            for i in range(0, len(keys), KEYS_PER_LOOKUP):
                found |= _known(conn, keys[i : i + KEYS_PER_LOOKUP])
        return found

    def stored_body(self, request_id: int) -> dict[str, Any]:
        """A request's body fields as stored (to name what a conflict differs in)."""
        with self.engine.connect() as conn:
            return dict(conn.execute(_BODIES, {"b_ids": [request_id]}).one()._mapping)

    def next_fair_seqs(self, job_ids: Iterable[str | None]) -> dict[str | None, int]:
        """Per job, the `fair_seq` its next request gets: read once per enqueue, then counted
        on by the caller (the column orders claims fairly; it need not be unique)."""
        c = requests.c
        seqs: dict[str | None, int] = {}
        with self.engine.connect() as conn:
            for job_id in job_ids:
                where = c.job_id.is_(None) if job_id is None else c.job_id == job_id
                top = conn.execute(select(func.coalesce(func.max(c.fair_seq), 0)).where(where)).scalar_one()
                seqs[job_id] = int(top) + 1
        return seqs

    def insert_chunk(self, rows_json: str, hashes: dict[str, str], job_ids: set[str]) -> ChunkWritten:
        """One transaction: the chunk's jobs (if new), its rows (keys already there skipped), and
        for each skipped key the check that its stored body is the same (else `KeyConflict`).

        `rows_json` is the chunk as a JSON array of objects with `COLUMN_NAMES`; `hashes` maps
        each of its keys (unique within the chunk) to its body hash.
        """
        stmt = _INSERT_CHUNK[self.dialect.name]
        with transaction(self.engine, self.dialect) as conn:
            for job_id in sorted(job_ids):
                conn.execute(self.dialect.insert_ignore(jobs, ["id"]), {"id": job_id, "status": "running"})
            result = self.dialect.execute(conn, stmt, {"b_rows": rows_json})
            returned: Sequence[Any] = result.all()
            new = [(int(row[0]), str(row[1])) for row in returned]
            added = {key for _, key in new}
            skipped = [key for key in hashes if key not in added]
            if skipped:
                known = _known(conn, skipped)
                for key in skipped:
                    if known[key].body_hash != hashes[key]:
                        raise KeyConflict(key, known[key].request_id)
        return ChunkWritten(new, len(skipped))

    def queue_depth(self) -> int:
        with self.engine.connect() as conn:
            count = select(func.count()).select_from(requests).where(requests.c.status == RequestStatus.QUEUED.value)
            return int(conn.execute(count).scalar_one())


def _known(conn: Connection, keys: list[str]) -> dict[str, Known]:
    rows = conn.execute(_KNOWN, {"b_keys": keys}).all()
    older = [r.id for r in rows if r.body_hash is None]  # enqueued before migration 0005
    hashed = {r.id: body_hash(dict(r._mapping)) for r in conn.execute(_BODIES, {"b_ids": older})} if older else {}
    return {r.idempotency_key: Known(int(r.id), r.body_hash or hashed[r.id]) for r in rows}
