"""Shared set-up for the benchmarks: fresh databases, the mock provider process, the seed-like load."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg

from ledger.enqueue import RequestSpec, build_spec

PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


@contextmanager
def fresh_database(kind: str) -> Iterator[str]:
    """A URL to an empty SQLite file or an empty PostgreSQL schema, removed afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'bench.db'}"
        return
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def mock_process(*args: str) -> Iterator[str]:
    """The mock provider in its own process (its CPU does not compete with the daemon's)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapters.mock_server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip().rsplit(" ", 1)[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def stats(base_url: str) -> dict[str, Any]:
    return dict(httpx.get(base_url + "/_stats", timeout=5).json())


def specs(n: int, provider: str = "openai", model: str = "gpt-4o-mini") -> list[RequestSpec]:
    return [
        build_spec(
            provider=provider,
            model=model,
            idempotency_key=f"bench-{i}",
            messages=[{"role": "user", "content": f"Evaluate item {i}."}],
            trace={"agent": f"agent-{i % 3}", "dimension": f"dim-{i}"},
        )
        for i in range(n)
    ]
