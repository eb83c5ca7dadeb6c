"""What every command shares: the consoles, one-line operator errors, settings and the store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NoReturn

import typer
from rich.console import Console

from ledger.enqueue import EnqueueError
from ledger.errors import DatabaseError
from ledger.settings import Settings, SettingsError, load_settings

out = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def operator_errors() -> Iterator[None]:
    """Turn the errors an operator can cause into one line and exit 2."""
    try:
        yield
    except (SettingsError, EnqueueError, DatabaseError) as exc:
        fail(str(exc))
    except ValueError as exc:
        if str(exc).startswith(("MAX_CONCURRENT_LLM_CALLS", "LEDGER_", "OPENAI_", "ANTHROPIC_")):
            fail(str(exc))
        raise


def settings_or_exit(**overrides: Any) -> Settings:
    with operator_errors():
        return load_settings(**overrides)


def open_store(settings: Settings) -> Any:
    """The store at LEDGER_DATABASE_URL, made (and upgraded) if need be: for the commands that
    write requests (enqueue, daemon, migrate, eval, demo)."""
    from ledger.store import Store

    with operator_errors():
        return Store(settings.database_url)


def require_ledger(settings: Settings) -> None:
    """Exit 2 with one line unless LEDGER_DATABASE_URL holds a ledger. Commands that only read
    (or change what is there) call it first: pointed at a mistyped path they would otherwise
    make an empty ledger there and answer as if it were empty. Nothing is created."""
    from ledger.store.schema import ledger_exists, shown_url

    with operator_errors():
        found = ledger_exists(settings.database_url)
    if not found:
        fail(
            f"no ledger at {shown_url(settings.database_url)} (LEDGER_DATABASE_URL): check the URL; "
            "ledger enqueue, ledger eval or ledger migrate creates one"
        )


def open_ledger(settings: Settings) -> Any:
    """The store of an existing ledger (`require_ledger`), for the commands that only read it."""
    require_ledger(settings)
    return open_store(settings)


def text_of(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="milliseconds")
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def configure_logs(settings: Settings) -> None:
    """The JSON event lines at LEDGER_LOG_LEVEL, for a command that logs (enqueue, the daemon)."""
    from ledger.events import configure_logging

    configure_logging(settings.log_level)
