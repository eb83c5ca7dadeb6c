"""`ledger pools` (every pool: its limits, in flight, paused until), `ledger pools set POOL` and
`ledger pools reset POOL`: a pool's limits changed live, stored in the ledger and applied by
every daemon at its next claim (ledger/store/pool_overrides.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ledger.console import fail, json_default, open_store, operator_errors, out, settings_or_exit, text_of
from ledger.pools import normalize_endpoint
from ledger.settings import Settings

LIMIT_RANGE = (1, 50)  # a pool's concurrency, as MAX_CONCURRENT_LLM_CALLS allows it


def register_pool_commands(pools_app: typer.Typer) -> None:
    pools_app.callback(invoke_without_command=True, no_args_is_help=False)(list_pools)
    pools_app.command("set")(set_pool)
    pools_app.command("reset")(reset_pool)


def pool_key(given: str) -> str:
    """`given` if it is a pool key as `ledger pools` names them (`provider:model`, `http:host:port`,
    `id:name`), else exit 2 with one line."""
    try:
        key = normalize_endpoint(given)
    except ValueError as exc:
        fail(f"pool {given!r}: {exc}")
    if key != given:
        fail(f"pool {given!r} is not a pool key (as `ledger pools` names them: {key!r}?)")
    return key


def pools_view(store: Any, settings: Settings) -> list[dict[str, Any]]:
    """Every pool the ledger or the settings know: configured and learned limit, RPM/TPM, in
    flight, queued, paused until; a live change (`ledger pools set`) over the settings."""
    usage = store.pool_usage()
    changed = store.pool_overrides()
    rules = settings.pool_rules
    known = sorted(set(usage) | set(changed) | set(settings.pool_limits) | set(rules.rpm) | set(rules.tpm))
    view = []
    for pool in known:
        u, o = usage.get(pool, {}), changed.get(pool, {})
        view.append(
            {
                "pool": pool,
                "limit": min(o["concurrency"], settings.max_concurrent_llm_calls)
                if o.get("concurrency") is not None
                else settings.pool_limit(pool),
                "configured_limit": settings.pool_limit(pool),
                "learned_limit": u.get("learned_limit"),
                "rpm": o["rpm"] if o.get("rpm") is not None else rules.rpm.get(pool),
                "tpm": o["tpm"] if o.get("tpm") is not None else rules.tpm.get(pool),
                "in_flight": u.get("running", 0),
                "queued": u.get("queued", 0),
                "paused_until": u.get("paused_until"),
                "set_live": {k: v for k, v in o.items() if k != "endpoint" and v is not None},
            }
        )
    return view


def list_pools(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Every pool: its limit (set live or configured), learned limit, RPM/TPM, in flight, paused until."""
    if ctx.invoked_subcommand is not None:
        return
    settings = settings_or_exit()
    store = open_store(settings)
    view = pools_view(store, settings)
    if as_json:
        out.print_json(json.dumps(view, default=json_default))
        return
    table = Table("pool", "limit", "configured", "learned", "rpm", "tpm", "in flight", "queued", "paused until")
    for p in view:
        live = " (set live)" if "concurrency" in p["set_live"] else ""
        table.add_row(
            p["pool"],
            f"{p['limit']}{live}",
            str(p["configured_limit"]),
            text_of(p["learned_limit"]),
            text_of(p["rpm"]),
            text_of(p["tpm"]),
            str(p["in_flight"]),
            str(p["queued"]),
            text_of(p["paused_until"]),
        )
    out.print(table)


def set_pool(
    pool: Annotated[str, typer.Argument(help="The pool (provider:model, as `ledger pools` names it).")],
    limit: Annotated[int | None, typer.Option(help="Calls in flight at once, 1-50.")] = None,
    rpm: Annotated[int | None, typer.Option(help="Calls started per minute at most.")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens per minute at most.")] = None,
) -> None:
    """Change a pool's limits now: every daemon applies them at its next claim, and they outlive
    restarts until `ledger pools reset POOL`."""
    key = pool_key(pool)
    if limit is None and rpm is None and tpm is None:
        fail("ledger pools set: give --limit, --rpm or --tpm")
    low, high = LIMIT_RANGE
    if limit is not None and not low <= limit <= high:
        fail(f"--limit must be from {low} to {high}, got {limit}")
    for name, value in (("--rpm", rpm), ("--tpm", tpm)):
        if value is not None and value < 1:
            fail(f"{name} must be at least 1, got {value}")
    settings = settings_or_exit()
    store = open_store(settings)
    with operator_errors():
        said = store.set_pool_override(key, concurrency=limit, rpm=rpm, tpm=tpm)
    given = ", ".join(f"{k} {v}" for k, v in said.items() if k != "endpoint" and v is not None)
    out.print(f"pool {key}: {given}; every daemon applies it at its next claim", highlight=False, soft_wrap=True)


def reset_pool(
    pool: Annotated[str, typer.Argument(help="The pool (provider:model, as `ledger pools` names it).")],
) -> None:
    """Return a pool to its settings (undo `ledger pools set`)."""
    key = pool_key(pool)
    store = open_store(settings_or_exit())
    with operator_errors():
        reset = store.reset_pool_override(key)
    if not reset:
        fail(f"pool {key!r} has no limits set live", code=1)
    out.print(f"pool {key}: back to its settings", highlight=False, soft_wrap=True)
