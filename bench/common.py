"""Shared set-up for the benchmarks: fresh databases, the mock provider process, the seed-like load."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from ledger.enqueue import RequestSpec, build_spec

# The same variable as the tests' (an existing server); the benchmarks start none of their own.
PG_DSN = (
    os.environ.get("LEDGER_TEST_POSTGRES_URL")
    or os.environ.get("LEDGER_TEST_PG_DSN")
    or "postgresql://postgres@127.0.0.1:5432/test"
)


@contextmanager
def fresh_database(kind: str, dsn: str = PG_DSN) -> Iterator[str]:
    """A URL to an empty SQLite file or an empty PostgreSQL schema, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"
        return
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            yield dsn.replace("postgresql://", "postgresql+psycopg://") + f"?options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a live process from /proc/<pid>/stat, in seconds (None once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 onwards
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15: utime, stime


def machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds over all cores since boot, from /proc/stat. Busy leaves out idle,
    iowait and steal (another guest's time); guest time is already inside user."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(ticks[:8])
    return (total - ticks[3] - ticks[4] - ticks[7]) / CLK_TCK, total / CLK_TCK


def specs(n: int, provider: str = "openai", model: str = "gpt-4o-mini", first: int = 0) -> list[RequestSpec]:
    """`n` requests, keyed and numbered from `first` (a later batch for the same ledger)."""
    return [
        build_spec(
            provider=provider,
            model=model,
            idempotency_key=f"bench-{i}",
            messages=[{"role": "user", "content": f"Evaluate item {i}."}],
            trace={"agent": f"agent-{i % 3}", "dimension": f"dim-{i}"},
        )
        for i in range(first, first + n)
    ]
