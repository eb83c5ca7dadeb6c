"""ledger: a durable request ledger for LLM pipelines.

Stages write `llm_requests` rows; `ledger daemon` claims them under bounded
slots and calls the providers; everything is auditable with SQL.

The names below are imported on first use (PEP 562), not with the package: every
`ledger` process imports this package first, and some commands (`--help`, the mock
provider) need neither the store nor SQLAlchemy. Importing all of it up front was most
of such a process's start-up (docs/decisions.md, 83).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger.api import Ledger as Ledger
    from ledger.enqueue import EnqueueError as EnqueueError
    from ledger.enqueue import RequestSpec as RequestSpec
    from ledger.settings import Settings as Settings
    from ledger.settings import SettingsError as SettingsError
    from ledger.settings import load_settings as load_settings
    from ledger.spec import JobSpec as JobSpec
    from ledger.spec import SpecError as SpecError
    from ledger.spec import load_spec as load_spec
    from ledger.store.jobs import Staged as Staged
    from ledger.store.jobs import TriggerRefused as TriggerRefused

# Each public name and the module that defines it.
_HOMES = {
    "EnqueueError": "ledger.enqueue",
    "JobSpec": "ledger.spec",
    "Ledger": "ledger.api",
    "RequestSpec": "ledger.enqueue",
    "Settings": "ledger.settings",
    "SettingsError": "ledger.settings",
    "SpecError": "ledger.spec",
    "Staged": "ledger.store.jobs",
    "TriggerRefused": "ledger.store.jobs",
    "load_settings": "ledger.settings",
    "load_spec": "ledger.spec",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
