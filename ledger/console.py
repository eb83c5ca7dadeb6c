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
    from ledger.store import Store

    with operator_errors():
        return Store(settings.database_url)


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
