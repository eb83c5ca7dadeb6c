"""ledger: a durable request ledger for LLM pipelines.

Stages write `llm_requests` rows; `ledger daemon` claims them under bounded
slots and calls the providers; everything is auditable with SQL.
"""

from ledger.api import Ledger
from ledger.enqueue import EnqueueError, RequestSpec
from ledger.settings import Settings, SettingsError, load_settings
from ledger.spec import JobSpec, SpecError, load_spec
from ledger.store.jobs import Staged, TriggerRefused

__all__ = [
    "EnqueueError",
    "JobSpec",
    "Ledger",
    "RequestSpec",
    "Settings",
    "SettingsError",
    "SpecError",
    "Staged",
    "TriggerRefused",
    "load_settings",
    "load_spec",
]
