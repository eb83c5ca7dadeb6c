"""The command line's delivery `auto` pieces: `--deadline`, read once for a whole file; how a
job's requests were answered and what batches saved (`status --json`, `report`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from ledger.console import fail, open_store, operator_errors, out, settings_or_exit, text_of
from ledger.deadlines import parse_deadline
from ledger.enqueue import Defaults, RequestSpec
from ledger.settings import Settings
from ledger.statuses import DeliveryChoice


def deadline_option(given: str | None, delivery: DeliveryChoice | None) -> datetime | None:
    """`--deadline` as a UTC time (a duration counts from now), or exit 2 with one line: a value
    that is neither a duration nor an ISO time, or a deadline without `--delivery auto`."""
    if given is None:
        return None
    if delivery != DeliveryChoice.AUTO:
        fail("--deadline: only with --delivery auto")
    try:
        return parse_deadline(given)
    except ValueError as exc:
        fail(f"--{exc}")


def job_delivery_json(store: Any, settings: Settings, job_id: str) -> dict[str, Any]:
    """A job's deadline, its answers by path (`answered_via`), how many came after the deadline
    (`late`), its cost and what it would have cost all online (`saved_usd`: the difference)."""
    from ledger.savings import job_savings

    return {**store.job_delivery(job_id), **job_savings(store.job_costs(job_id), settings.prices)}


def print_job_cost(store: Any, job_id: str) -> None:
    """`cost: $1.20 (all online $2.10: $0.90 saved by provider batches); 180 via batch, 20 online, 0 late`."""
    said = job_delivery_json(store, settings_or_exit(), job_id)
    line = f"cost: ${said['cost_usd']:.4f}"
    if said["saved_usd"] > 0:
        line += f" (all online ${said['all_online_usd']:.4f}: ${said['saved_usd']:.4f} saved by provider batches)"
    paths = ", ".join(f"{n} via {path}" for path, n in sorted(said["answered_via"].items()))
    if paths:
        line += f"; {paths}"
    if said["deadline"] is not None:
        line += f"; deadline {text_of(said['deadline'])}, {said['late']} answered late"
    out.print(line, highlight=False, soft_wrap=True)


def estimate_store(settings: Settings) -> Any | None:
    """The ledger an estimate reads its cache hits from, opened only if it exists: an estimate
    never creates a database (a SQLite file that is not there has no answers to reuse)."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and (not url.database or not Path(url.database).exists()):
        return None
    return open_store(settings)


def print_estimate(specs: Iterable[Any], settings: Settings, as_json: bool) -> None:
    """`--estimate`: per provider and model and in total, the requests, input tokens, the output
    ceiling, the worst case online and in batches, the cache hits; nothing written."""
    from ledger.estimate import estimate

    store = estimate_store(settings)
    with operator_errors():
        said = estimate(specs, settings, store)
    if store is not None:
        store.close()
    if as_json:
        out.print_json(json.dumps(said))
        return
    table = Table("provider", "model", "requests", "cache hits", "input tokens", "max output", "online $", "batch $")
    for m in said["by_model"]:
        cost = m["worst_case_usd"]
        table.add_row(
            m["provider"],
            m["model"],
            str(m["requests"]),
            str(m["cache_hits"]),
            str(m["input_tokens"]),
            str(m["max_output_tokens"]),
            "no price" if cost["online"] is None else f"{cost['online']:.4f}",
            "no price" if cost["batch"] is None else f"{cost['batch']:.4f}",
        )
    out.print(table)
    total = said["worst_case_usd"]
    out.print(
        f"{said['requests']} request(s), {said['cache_hits']} answered from the cache (free): at most "
        f"${total['online']:.4f} online, ${total['batch']:.4f} in provider batches; nothing was written",
        highlight=False,
        soft_wrap=True,
    )
    if said["unpriced_models"]:
        out.print(f"no price for: {', '.join(said['unpriced_models'])} (add them with LEDGER_PRICES_FILE)")


def file_specs(path: Path, defaults: Defaults, settings: Settings) -> Iterator[RequestSpec]:
    """The requests of a JSONL file, as an enqueue would read them (a bad line: `FILE:LINE: problem`)."""
    from ledger.enqueue import read_jsonl_file

    for _, spec in read_jsonl_file(path, defaults, settings.max_line_bytes):
        yield spec


def job_requests(spec: Any, settings: Settings) -> list[RequestSpec]:
    """The requests `ledger eval` would stage for a job spec."""
    from ledger.jobs import first_requests

    return first_requests(spec, settings)
