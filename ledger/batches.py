"""Provider batch jobs: group, submit exactly once, poll, map every result back by `custom_id`.

One loop in the daemon does it all, a step at a time, each step under the
batch's lease (renewed while the step runs, so a long upload or mapping keeps
it; lost, the step stops and writes nothing more):

- **Group.** Queued `delivery=batch` requests are grouped by (provider, model,
  params, job). A group closes at `LEDGER_PROVIDER_BATCH_SIZE` requests or when
  its oldest has waited `LEDGER_PROVIDER_BATCH_WAIT` seconds, and is cut at the
  provider's limits by count and by bytes. Providers without a batch API get
  their requests through the online path instead ("simulated batching").
- **Submit exactly once.** The batch row is written and its requests attached
  (status `submitted`, attempt opened) before any provider call; the uploaded
  file's id is stored before the create call; every `custom_id` names the
  request and the batch (`b<batch>-<submit key>-r<request>`). A `submitting`
  batch taken up again (a crash, a restart) is first looked for at the
  provider (`BatchAdapter.find`): adopted if there, created only if not.
- **Poll and map.** Submitted batches are read every `LEDGER_BATCH_POLL_INTERVAL`
  seconds; an ended one has its results streamed and written back in chunks,
  one transaction each (mapping again after a crash changes nothing twice).
"""

from __future__ import annotations

import logging
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio

from adapters.batch_interface import BatchAdapter, BatchLine, BatchTag, ProviderBatch, ReconcileLater
from adapters.errors import BatchRejection, ProviderError
from adapters.registry import BATCH_PROVIDERS, make_batch_adapter, missing_key
from ledger import events
from ledger.deadline_fallback import DeadlineFallback
from ledger.executor import stored_call
from ledger.metrics import NO_METRICS, Metrics
from ledger.parsing import derive
from ledger.pools import endpoint_for
from ledger.prices import Price, PriceTable
from ledger.record import DbLane
from ledger.retry import RetryPolicy
from ledger.settings import Settings
from ledger.statuses import BatchStatus
from ledger.stop_points import stop_point
from ledger.store import Store
from ledger.store.batch_results import LineOutcome, Mapped
from ledger.store.batches import BatchGroup, BatchLease, BatchLeaseLost
from ledger.store.errors import DatabaseUnavailable
from ledger.waits import Handoff, as_raised

LOG = logging.getLogger("ledger.batches")
# Result lines per transaction. Each transaction holds the ledger's turn alone (an online claim waits at
# most one chunk, ~0.15 s on PostgreSQL) and pays a fixed toll: the lock, the lease fence, the
# commit, and the database lane's other users in between. 5,000 mapped 100,000 requests
# 10-15 % faster than 2,000 on PostgreSQL; 10,000 no faster again (docs/benchmarks-history.md).
MAP_CHUNK = 5000
READ_CHUNK = 1000  # requests read per query while building an input
# A provider's clock and the database's may differ: look this much further back for a batch
# that may have been created before a crash.
RECONCILE_SLACK_S = 600.0


def custom_id(batch_id: int, submit_key: str, request_id: int) -> str:
    """Names the request and its ledger batch; fits Anthropic's `^[a-zA-Z0-9_-]{1,64}$`."""
    return f"b{batch_id}-{submit_key}-r{request_id}"


def request_of(batch_id: int, submit_key: str) -> Callable[[str], int | None]:
    """The request a `custom_id` names if it is a line of this ledger batch, else None.

    Checked against the batch's own prefix rather than parsed whole: it runs once per
    result line, and a regular expression per line was a tenth of the mapping's time."""
    prefix = custom_id(batch_id, submit_key, 0)[:-1]
    size = len(prefix)

    def request(value: str) -> int | None:
        rest = value[size:]
        if not value.startswith(prefix) or not (rest.isascii() and rest.isdigit()) or rest[0] == "0":
            return None
        return int(rest)

    return request


class BatchWorker:
    """The daemon's provider-batch loop (one per daemon)."""

    def __init__(
        self,
        store: Store,
        lane: DbLane,
        settings: Settings,
        worker_id: str,
        adapters: dict[str, BatchAdapter] | None = None,
        *,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.store = store
        self.lane = lane
        self.settings = settings
        self.worker = worker_id
        self.prices: PriceTable = settings.prices
        self.policy = RetryPolicy(settings.retry_initial_delay, settings.retry_max_delay, settings.retry_max_attempts)
        self._adapters: dict[str, BatchAdapter] = dict(adapters or {})
        self._said_online: set[str] = set()
        self._said_unconfigured: set[str] = set()
        self._workdir = Path(tempfile.mkdtemp(prefix="ledger-batches-"))
        self.step_started = 0.0  # wall clock at the start of the step under way (for its events)
        self.fallback = DeadlineFallback(store, lane, settings, metrics)

    # -- the loop --------------------------------------------------------------

    async def run(self, *, stop: anyio.Event, until_idle: bool, progressed: Callable[[], None] = lambda: None) -> None:
        """`progressed` is called after every cycle that did something (results mapped back may
        let a job go on)."""
        # A previous process under this worker id left these leased: take the next step at once.
        await self.lane.run(self.store.release_batch_leases, self.worker)
        try:
            while not stop.is_set():
                if await self.cycle(stop):
                    progressed()
                    continue
                if until_idle and not await self.lane.run(self.store.has_batch_work):
                    return
                with anyio.move_on_after(self.settings.poll_interval):
                    await stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self.lane.run(self.store.release_batch_leases, self.worker)
                for adapter in self._adapters.values():
                    await adapter.aclose()
                for leftover in self._workdir.glob("*"):
                    leftover.unlink(missing_ok=True)
                with suppress(OSError):
                    self._workdir.rmdir()

    async def cycle(self, stop: anyio.Event) -> bool:
        """Submit what is ready, then take every batch step that is due; True if anything was done."""
        did = await self.fallback.check()
        groups = await self.lane.run(self.store.batch_groups, self.settings.provider_batch_wait)
        if any(g.provider not in BATCH_PROVIDERS for g in groups):
            await self._go_online()
        # Ready: its oldest request has waited long enough, or it fills a batch (at the provider's own
        # limit when that is lower than LEDGER_PROVIDER_BATCH_SIZE).
        for group in groups:
            if group.provider not in BATCH_PROVIDERS or await self._unconfigured(group.provider):
                continue
            if not group.waited and group.queued < self._batch_limit(await self.adapter(group.provider)):
                continue
            if stop.is_set():
                return did
            # A group none of whose requests the budget can pay for attaches nothing: that is no
            # progress, so the loop waits for its poll interval instead of trying again at once.
            if await self._guarded(self.submit_group(group)):
                did = True
        while not stop.is_set():
            row = await self.lane.run(self.store.take_batch, self.worker, self.settings.lease_seconds)
            if row is None:
                return did
            await self._guarded(self.step(row))
            did = True
        return did

    async def _guarded(self, step: Any) -> Any:
        """One step's failures stay that step's: a lost lease or a provider error is logged, the
        loop goes on (the batch's state in the ledger says where the next step resumes).
        Returns what the step returned (None when it failed)."""
        self.step_started = time.time()
        try:
            return await step
        except BatchLeaseLost as exc:
            LOG.warning("batch lease lost: step abandoned", extra={"details": {"error": str(exc)}})
        except ProviderError as exc:
            LOG.error("batch step failed at the provider", extra={"details": {"error": exc.message}})
        except DatabaseUnavailable:
            raise  # the lane already retried: the database is gone, and the daemon stops
        except Exception:  # a bug in one step must not take the daemon down; the lease expires
            LOG.exception("batch step failed; it is taken up again when its lease expires")
        return None

    async def _go_online(self) -> None:
        moved = await self.lane.run(self.store.move_to_online, BATCH_PROVIDERS)
        for provider, count in moved.items():
            if provider not in self._said_online:
                self._said_online.add(provider)
                events.simulated_batching(provider, count)

    async def _unconfigured(self, provider: str) -> bool:
        """A provider whose API key is missing is sent no batch: its queued batch requests end
        `config_error` naming the variable (said once in an ERROR line), as its online calls do,
        instead of an upload with a placeholder key whose refusal names nothing."""
        missing = missing_key(provider, self.settings)
        if missing is None:
            return False
        ended = await self.lane.run(self.store.end_unconfigured_batch_requests, provider, missing)
        if provider not in self._said_unconfigured:
            self._said_unconfigured.add(provider)
            details = {"provider": provider, "error": missing, "requests": ended}
            LOG.error("provider not configured: its requests end config_error", extra={"details": details})
        return True

    def _batch_limit(self, adapter: BatchAdapter) -> int:
        return min(self.settings.provider_batch_size, adapter.max_requests)

    async def adapter(self, provider: str) -> BatchAdapter:
        """Built once, off the event loop: importing an SDK takes ~1 s, which on the loop would
        stall every online call in flight (as `Scheduler.adapter_for` avoids too)."""
        if provider not in self._adapters:
            self._adapters[provider] = await anyio.to_thread.run_sync(make_batch_adapter, provider, self.settings)
        return self._adapters[provider]

    @asynccontextmanager
    async def leased(self, lease: BatchLease) -> AsyncIterator[None]:
        """Keep the batch's lease while the step runs; a renewal that finds it lost stops the step."""
        lost: list[bool] = []
        with as_raised():
            async with anyio.create_task_group() as tg:

                async def renew() -> None:
                    while True:
                        await anyio.sleep(self.settings.lease_seconds / 3)
                        with suppress(DatabaseUnavailable):  # the lane retried; the next try or the fence decides
                            if not await self.lane.run(self.store.renew_batch, lease, self.settings.lease_seconds):
                                lost.append(True)
                                tg.cancel_scope.cancel()
                                return

                tg.start_soon(renew)
                yield
                tg.cancel_scope.cancel()
        if lost:
            raise BatchLeaseLost(f"batch {lease.id}: lease taken over while a step ran")

    # -- submitting ------------------------------------------------------------

    async def submit_group(self, group: BatchGroup) -> bool:
        """A new batch for a closed group: open it, choose and attach its requests, submit.
        False when nothing could be attached (canceled meanwhile, or none within budget)."""
        adapter = await self.adapter(group.provider)
        limit = self._batch_limit(adapter)
        max_bytes = min(self.settings.provider_batch_max_bytes or adapter.max_bytes, adapter.max_bytes)
        key = secrets.token_hex(4)
        lease = await self.lane.run(self.store.open_batch, group, self.worker, self.settings.lease_seconds, key)
        async with self.leased(lease):
            t0 = time.monotonic()
            ids = sorted(await self.lane.run(self.store.group_request_ids, group, limit))
            path = self._workdir / f"batch-{lease.id}.jsonl"
            chosen, size = await self._write_input(adapter, lease.id, key, ids, path, max_bytes)
            attached = await self.lane.run(self.store.attach, lease, chosen, size, self.settings.daily_budget_usd)
            if not attached:
                path.unlink(missing_ok=True)
                return False
            if attached != chosen:  # some were canceled meanwhile: the input must name exactly these
                _, size = await self._write_input(adapter, lease.id, key, attached, path, max_bytes)
            build_s = time.monotonic() - t0
            await self._submit(adapter, lease, key, path, len(attached), size, build_s)
        return True

    async def _write_input(
        self, adapter: BatchAdapter, batch_id: int, key: str, ids: Sequence[int], path: Path, max_bytes: int
    ) -> tuple[list[int], int]:
        """Write the input for `ids` (in that order) streaming, stopping before `max_bytes`;
        returns the ids written and the size. Encoding runs off the event loop."""
        layout = adapter.layout
        written: list[int] = []
        entry_bytes = 0
        with path.open("wb") as out:
            out.write(layout.head)
            for start in range(0, len(ids), READ_CHUNK):
                rows = await self.lane.run(self.store.request_inputs, ids[start : start + READ_CHUNK])
                entries = await anyio.to_thread.run_sync(_encode_all, adapter, batch_id, key, rows)
                for request_id, entry in entries:
                    if layout.size(len(written) + 1, entry_bytes + len(entry)) > max_bytes:
                        out.write(layout.tail)
                        return written, layout.size(len(written), entry_bytes)
                    if written:
                        out.write(layout.sep)
                    out.write(entry)
                    written.append(request_id)
                    entry_bytes += len(entry)
            out.write(layout.tail)
        return written, layout.size(len(written), entry_bytes)

    async def _submit(
        self, adapter: BatchAdapter, lease: BatchLease, key: str, path: Path, count: int, size: int, build_s: float
    ) -> None:
        """Upload (its file id stored before anything else), then create; record the provider's id."""
        tag = BatchTag(lease.id, key)
        t0 = time.monotonic()
        try:
            file_id = await adapter.upload(path)
            if file_id is not None:
                await self.lane.run(self.store.set_input_file, lease, file_id)
            created = await adapter.create(path, file_id, tag)
        except ProviderError as exc:
            await self._submit_failed(lease, exc, adapter.name)
            return
        finally:
            path.unlink(missing_ok=True)
        await self.lane.run(
            self.store.mark_submitted, lease, created.id, created.status, self.settings.batch_poll_interval
        )
        events.batch_submitted(
            lease.id,
            adapter.name,
            created.id,
            count,
            size,
            round(build_s, 3),
            round(time.monotonic() - t0, 3),
            self.step_started,
        )

    async def _submit_failed(self, lease: BatchLease, error: ProviderError, provider: str) -> None:
        """A refused create: the entries the provider named fail, the others go back to the queue
        (a refusal naming none is a failed attempt for each, under the retry policy). A transient
        failure leaves the batch `submitting`: the next step looks for it at the provider first."""
        if error.retryable and not error.rejections:
            delay = self.policy.delay(1, error.retry_after)
            await self.lane.run(self.store.release_batch, lease, delay)
            LOG.warning(
                "batch create failed, will look for it and try again",
                extra={"details": {"batch_id": lease.id, "error": error.message, "retry_in_s": round(delay, 1)}},
            )
            return
        LOG.error(
            "batch refused by the provider",
            extra={"details": {"batch_id": lease.id, "provider": provider, "error": error.message}},
        )
        rejected = await self._rejected_requests(lease, error.rejections)
        await self._finish(
            lease,
            BatchStatus.ERROR.value,
            error=f"rejected by the provider: {error.message}",
            rejected=rejected,
            count_failure=None if rejected else error.message,
        )

    # -- steps on an existing batch --------------------------------------------

    async def step(self, row: dict[str, Any]) -> None:
        lease = BatchLease(int(row["id"]), int(row["lease_token"]), self.worker)
        async with self.leased(lease):
            if row["status"] == BatchStatus.QUEUED.value:  # opened, never attached: a crash in between
                await self.lane.run(self.store.attach, lease, [], 0)
            elif row["status"] == BatchStatus.SUBMITTING.value:
                await self.resume(lease, row)
            else:
                await self.poll(lease, row)

    async def resume(self, lease: BatchLease, row: dict[str, Any]) -> None:
        """A `submitting` batch taken up again: the provider may have accepted it before the
        ledger could record that. Look for it first; create it only if it is not there."""
        adapter = await self.adapter(row["provider"])
        key = str(row["submit_key"])
        ids = await self.lane.run(self.store.batch_request_ids, lease.id)
        if not ids or row["cancel_requested_at"] is not None:
            await self._finish(lease, BatchStatus.CANCELED.value, error="canceled before it was submitted")
            return
        # OpenAI's create needs the uploaded file's id, stored before the call: without it, no create
        # was made. Anthropic's create carries the requests: any taken-up batch may exist.
        if row["input_file_id"] is not None or not adapter.uploads_input:
            created_after = row["created_at"].timestamp() - RECONCILE_SLACK_S
            is_ours = request_of(lease.id, key)
            try:
                found = await adapter.find(
                    BatchTag(lease.id, key),
                    created_after,
                    int(row["request_total"]),
                    lambda cid: is_ours(cid) is not None,
                )
            except ReconcileLater as exc:
                LOG.warning("batch not resubmitted yet", extra={"details": {"batch_id": lease.id, "why": str(exc)}})
                await self.lane.run(self.store.release_batch, lease, self.settings.batch_poll_interval)
                return
            if found is not None:
                await self.lane.run(
                    self.store.mark_submitted,
                    lease,
                    found.id,
                    found.status,
                    0.0 if found.ended else self.settings.batch_poll_interval,
                    adopted=True,
                )
                events.batch_adopted(lease.id, adapter.name, found.id, int(row["request_total"]))
                return
        path = self._workdir / f"batch-{lease.id}.jsonl"
        t0 = time.monotonic()
        _, size = await self._write_input(adapter, lease.id, key, ids, path, adapter.max_bytes)
        await self._submit(adapter, lease, key, path, len(ids), size, time.monotonic() - t0)

    async def poll(self, lease: BatchLease, row: dict[str, Any]) -> None:
        adapter = await self.adapter(row["provider"])
        provider_id = str(row["provider_batch_id"])
        interval = self.settings.batch_poll_interval
        refused = None
        fallback = row["fallback_at"] is not None
        try:
            wanted = row["cancel_requested_at"] is not None or fallback
            if wanted and row["cancel_sent_at"] is None:
                try:
                    await adapter.cancel(provider_id)
                except ProviderError as exc:  # the batch is looked at all the same: it may have ended
                    refused = f"cancel not taken: {exc.message}"
                else:
                    await self.lane.run(self.store.note_cancel_sent, lease.id)
                    stop_point("deadline_cancel_sent" if fallback else "cancel_sent")
            batch = await adapter.retrieve(provider_id)
        except ProviderError as exc:  # a local or transient failure: what the provider said stays
            why = exc.message
            await self.lane.run(lambda: self.store.note_poll(lease, poll_error=why, release_for=interval))
            return
        if fallback and not batch.ended:  # not waiting for the provider's cancel: its late answers are kept apart
            self.fallback.said(lease.id, await self.lane.run(self.store.detach_for_deadline, lease))
        await self.lane.run(
            lambda: self.store.note_poll(
                lease,
                provider_status=batch.status,
                counts=batch.counts,
                output_file_id=batch.output_file_id,
                error_file_id=batch.error_file_id,
                # Not ended, a refused cancel is sent again at the next poll; ended, it is moot.
                poll_error=None if batch.ended else refused,
                release_for=None if batch.ended else interval,  # an ended batch is mapped under this lease
            )
        )
        events.batch_polled(lease.id, provider_id, batch.status, self.worker, self.step_started)
        if batch.ended:
            await self.map_back(adapter, lease, row, batch)

    async def map_back(
        self, adapter: BatchAdapter, lease: BatchLease, row: dict[str, Any], batch: ProviderBatch
    ) -> None:
        """Stream an ended batch's results into the ledger, a chunk per transaction; then end it.

        Lines are parsed while the previous chunk is written; each write takes every line
        parsed meanwhile, up to `MAP_CHUNK` (one write at a time, in order; at most two
        chunks' lines in memory)."""
        t0 = time.monotonic()
        key = str(row["submit_key"])
        request, price = request_of(lease.id, key), self.prices.price(row["provider"], row["model"])
        keep = self.settings.keeps_response
        parsers = await self.lane.run(self.store.batch_parsers, lease.id)
        total = Mapped()
        foreign = 0
        parsed = Handoff[LineOutcome](MAP_CHUNK)

        async def write_all() -> None:
            while chunk := await parsed.take(MAP_CHUNK):
                total.add(await self._write_chunk(lease, chunk))

        with as_raised():  # a lost lease, a provider or database error: as it is
            async with anyio.create_task_group() as tg:
                tg.start_soon(write_all)
                try:
                    async for line in adapter.results(batch):
                        outcome = _outcome(line, request(line.custom_id), price, keep, parsers, self.prices)
                        if outcome is None:
                            foreign += 1
                        else:
                            await parsed.put(outcome)
                finally:
                    parsed.close()
        map_s = time.monotonic() - t0
        status, error, rejected, count_failure = await self._ending(lease, batch)
        left = await self._finish(lease, status, error=error, rejected=rejected, count_failure=count_failure)
        total.add(left)
        await adapter.clean_up(batch)
        events.batch_mapped(lease.id, batch.id, batch.status, total, foreign, round(map_s, 3))
        if left.online:
            pool = endpoint_for(row["provider"], row["model"], self.settings.compatible_base_url)
            self.fallback.said(lease.id, {pool: left.online})
        for request_id, cached_from in total.cache_hits:
            events.cache_hit(request_id, cached_from)

    async def _ending(
        self, lease: BatchLease, batch: ProviderBatch
    ) -> tuple[str, str | None, dict[int, str] | None, str | None]:
        """The ledger status of an ended batch, and how its unanswered requests end."""
        if batch.state == "completed":
            return BatchStatus.COMPLETED.value, None, None, None
        if batch.state == "canceled":
            return BatchStatus.CANCELED.value, "canceled at the provider", None, None
        if batch.state == "expired":
            return BatchStatus.ERROR.value, "expired before every request was answered", None, None
        why = "; ".join(f"{r.code}: {r.message}" for r in batch.rejections[:5]) or "failed at the provider"
        rejected = await self._rejected_requests(lease, batch.rejections)
        return BatchStatus.ERROR.value, f"failed validation: {why}", rejected, None if rejected else why

    async def _rejected_requests(self, lease: BatchLease, rejections: Sequence[BatchRejection]) -> dict[int, str]:
        """Request id -> reason for the input lines a provider's validation errors name (the input
        is in request-id order, so line N is the batch's N-th request)."""
        ids = await self.lane.run(self.store.batch_request_ids, lease.id)
        return {ids[r.line]: r.message for r in rejections if r.line is not None and r.line < len(ids)}

    async def _write_chunk(self, lease: BatchLease, chunk: list[LineOutcome]) -> Mapped:
        return await self.lane.run(
            self.store.map_lines, lease, chunk, self.settings.retry_max_attempts, self.policy.delay
        )

    async def _finish(
        self,
        lease: BatchLease,
        status: str,
        *,
        error: str | None = None,
        rejected: dict[int, str] | None = None,
        count_failure: str | None = None,
    ) -> Mapped:
        return await self.lane.run(
            lambda: self.store.finish_batch(
                lease,
                status,
                error=error,
                rejected=rejected,
                count_failure=count_failure,
                max_attempts=self.settings.retry_max_attempts,
                delay_for=self.policy.delay,
            )
        )


def _outcome(
    line: BatchLine,
    request_id: int | None,
    price: Price | None,
    keep_response: bool,
    parsers: dict[int, tuple[str, Any, Any]],
    prices: PriceTable | None = None,
) -> LineOutcome | None:
    """A result line ready to write (parsed, when its request says how), or None when it is not
    a line of this ledger batch (an adopted batch is checked line by line). An answer priced as
    another model than its batch's (Azure's: the model its deployment serves) is priced so."""
    if request_id is None:
        return None
    answer, cost, derived = line.answer, None, None
    if answer is not None:
        if answer.priced_as is not None and prices is not None:
            price = prices.price(*answer.priced_as)
        if price is not None:
            cost = price.answer_cost(answer, batch=True)
        if request_id in parsers:
            parse, response_format, params = parsers[request_id]
            derived = derive(
                parse, answer.text, response_format=response_format, finish_reason=answer.finish_reason, params=params
            )
        # The line's answer is this line's alone. The store writes the body's text; the parsed body
        # beside it, held until its chunk is written, was some twenty containers a line for the
        # garbage collector to walk again and again: a sixth of the mapping's time.
        if answer.response_text is not None or not keep_response:
            answer.response = None
        if not keep_response:
            answer.response_text = None
    return LineOutcome(
        request_id,
        line.kind,
        answer,
        cost,
        line.status_code,
        line.error_code,
        line.message,
        line.retryable,
        derived,
    )


def _encode_all(adapter: BatchAdapter, batch_id: int, key: str, rows: Sequence[Any]) -> list[tuple[int, bytes]]:
    return [
        (
            row.id,
            adapter.encode(
                custom_id(batch_id, key, row.id),
                stored_call(row.model, row.input, row.params, row.response_format, row.api),
            ),
        )
        for row in rows
    ]
