"""The Python API a pipeline stage imports: write requests, never call a model."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from ledger import events
from ledger.enqueue import EnqueueError, RequestSpec, as_spec, build_spec, to_row, warn_dropped
from ledger.settings import Settings, load_settings
from ledger.spec import JobSpec, load_spec, spec_from_mapping
from ledger.store import EnqueueResult, Store
from ledger.store.jobs import Staged

# Back-off while waiting for results: first look soon, then settle at one read a second.
_FIRST_POLL_S, _MAX_POLL_S = 0.05, 1.0


class Ledger:
    """A handle on one ledger database.

    >>> ledger = Ledger("sqlite:///ledger.db")
    >>> request_id = ledger.enqueue(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    """

    def __init__(self, url: str | None = None, *, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.store = Store(url or self.settings.database_url)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(self, spec: RequestSpec | Mapping[str, Any] | None = None, /, **fields: Any) -> int:
        """Queue one request; returns its id (the existing one if the key was seen before).

        The request is a `RequestSpec`, a mapping of its fields, or the fields as keywords
        (not both). Raises `EnqueueError` (one line) for a bad request, or for a key already
        in the ledger with a different body; nothing is written then.
        """
        from ledger.intake import enqueue_specs

        if spec is not None and fields:
            raise EnqueueError(f"give a request spec or its fields, not both (fields: {', '.join(sorted(fields))})")
        spec = as_spec(spec) if spec is not None else build_spec(**fields)
        result = enqueue_specs(self.store, self.settings, [spec], single=True)
        announce(result)
        warn_dropped(result.dropped)
        if result.inserted_rows:
            return int(result.inserted_rows[0]["id"])
        row = to_row(
            spec,
            self.settings.compatible_base_url,
            self.settings.prices,
            pools_per_model=self.settings.compatible_pools_per_model,
        )
        return self.store.id_for_key(row["idempotency_key"])

    def enqueue_many(self, specs: Iterable[RequestSpec | Mapping[str, Any]]) -> EnqueueResult:
        """Queue many requests, idempotently: all are checked before any is written.

        Each request is a `RequestSpec` or a mapping of its fields. A bad request, or a
        key used twice (in the batch, or against the ledger) with different bodies, raises
        `EnqueueError` naming `requests[i]`, with nothing written. A batch larger than one
        transaction (`Dialect.enqueue_pacing`) is written in several; run again after a
        crash half-way, it adds only the rest.
        """
        from ledger.intake import enqueue_specs

        if isinstance(specs, RequestSpec | Mapping | str | bytes):
            raise EnqueueError(f"enqueue_many takes a list of requests, got one {type(specs).__name__}")
        result = enqueue_specs(self.store, self.settings, specs)
        announce(result)
        warn_dropped(result.dropped)
        return result

    async def aenqueue(self, spec: RequestSpec | Mapping[str, Any] | None = None, /, **fields: Any) -> int:
        return await anyio.to_thread.run_sync(lambda: self.enqueue(spec, **fields))

    async def aenqueue_many(self, specs: Iterable[RequestSpec | Mapping[str, Any]]) -> EnqueueResult:
        specs = list(specs)
        return await anyio.to_thread.run_sync(lambda: self.enqueue_many(specs))

    # -- evaluation jobs -------------------------------------------------------

    def trigger(self, spec: JobSpec | str | Path | Mapping[str, Any]) -> Staged:
        """Stage an evaluation job (a spec, a TOML path, or a dict in the spec's shape).

        Raises `SpecError` for a bad spec and `TriggerRefused` at capacity or when
        today's budget is spent; re-triggering a job id adds nothing.
        """
        from ledger.jobs import trigger

        if isinstance(spec, str | Path):
            spec = load_spec(spec)
        elif not isinstance(spec, JobSpec):
            spec = spec_from_mapping(spec, source="spec", base_dir=Path.cwd(), default_id="job")
        return trigger(self.store, self.settings, spec)

    async def atrigger(self, spec: JobSpec | str | Path | Mapping[str, Any]) -> Staged:
        return await anyio.to_thread.run_sync(lambda: self.trigger(spec))

    def reparse(self, job_id: str) -> int:
        """Recompute the derived fields of a job's requests from their stored answers (and, for an
        evaluation job, its opinions); no provider call. Returns how many requests were parsed."""
        from ledger.jobs import is_evaluation, reparse, reparse_requests

        parsed = reparse_requests(self.store, job_id)
        if is_evaluation(self.store.get_job(job_id)):
            reparse(self.store, job_id)
        return parsed

    def lineage(self, request_id: int) -> list[dict[str, Any]]:
        """Every request behind `request_id` (its sources, theirs, ...), nearest first, with `depth`."""
        return self.store.lineage(request_id)

    @asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """Within the block, queued requests are worked on: by the daemons serving this database or,
        while none is alive, by one run here until the block ends (as `ledger eval --wait` does).
        Checked again every few seconds: a daemon that died (killed, say) is no reason to wait
        forever, and its requests come back when their leases expire. A stage awaits its results
        inside it."""
        from ledger.daemon import run_daemon

        stop = anyio.Event()

        async def watch() -> None:
            while await anyio.to_thread.run_sync(self.store.live_daemons, self.settings.lease_seconds):
                with anyio.move_on_after(max(self.settings.lease_seconds / 3, 0.5)):
                    await stop.wait()
                if stop.is_set():
                    return
            await run_daemon(self.settings, stop=stop, handle_signals=False)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            try:
                yield
            finally:
                stop.set()

    def wait(self, target: Sequence[int] | str, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """Block until every request (ids, or all of a job id's) is settled; return their rows.

        Settled: final (completed, error, canceled) and, for a request of an active
        evaluation job, parsed. Polls the ledger with back-off, so any process on
        the same database can wait for work done by any daemon. Raises TimeoutError.
        """
        polling = _Polling(target, timeout)
        while True:
            rows, settled = self._results(target)
            if settled:
                return rows
            time.sleep(polling.next_sleep(rows))

    async def await_results(self, target: Sequence[int] | str, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """`wait` for async stages: the event loop runs on while the ledger is polled."""
        polling = _Polling(target, timeout)
        while True:
            rows, settled = await anyio.to_thread.run_sync(self._results, target)
            if settled:
                return rows
            await anyio.sleep(polling.next_sleep(rows))

    def _results(self, target: Sequence[int] | str) -> tuple[list[dict[str, Any]], bool]:
        if isinstance(target, str):
            rows = self.store.request_results(job_id=target)
            job = self.store.get_job(target)
            if job is None:
                raise LookupError(f"no job {target!r}")
            job_over = job["kind"] != "eval" or job["status"] != "running"
            settled = job_over and all(r["settled"] for r in rows)
        else:
            rows = self.store.request_results(ids=list(target))
            if len(rows) != len(set(target)):
                missing = sorted(set(target) - {r["id"] for r in rows})
                raise LookupError(f"no request with id {missing[0]}")
            settled = all(r["settled"] for r in rows)
        return rows, settled


class _Polling:
    """How long to sleep between looks at the ledger: soon at first, then once a second, and
    never past the caller's timeout (TimeoutError, naming what is not settled yet)."""

    def __init__(self, target: Sequence[int] | str, timeout: float | None) -> None:
        self.target = target
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.delay = _FIRST_POLL_S

    def next_sleep(self, rows: list[dict[str, Any]]) -> float:
        sleep, self.delay = self.delay, min(self.delay * 2, _MAX_POLL_S)
        if self.deadline is None:
            return sleep
        left = self.deadline - time.monotonic()
        if left <= 0:
            waiting = sum(1 for r in rows if not r["settled"])
            what = f"job {self.target!r}" if isinstance(self.target, str) else f"{len(rows)} request(s)"
            raise TimeoutError(f"{what}: {waiting} request(s) not settled yet")
        return min(sleep, left)


def announce(result: EnqueueResult) -> None:
    """`queueing` events for newly queued requests (or one summary line for a huge enqueue)."""
    rows = result.inserted_rows
    if result.inserted and not rows:
        logging.getLogger("ledger.enqueue").info(
            "enqueued",
            extra={
                "details": {
                    "inserted": result.inserted,
                    "duplicates": result.duplicates,
                    "queue_depth": result.queue_depth,
                }
            },
        )
        return
    first_depth = result.queue_depth - len(rows)
    for i, row in enumerate(rows, start=1):
        events.queueing(row["id"], row.get("trace"), row["idempotency_key"], first_depth + i)
