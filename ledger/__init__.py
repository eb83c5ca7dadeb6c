"""ledger: a durable request ledger for LLM pipelines.

Stages write `llm_requests` rows; `ledger daemon` claims them under bounded
slots and calls the providers; everything is auditable with SQL.
"""

from ledger.api import Ledger
from ledger.enqueue import EnqueueError, RequestSpec
from ledger.settings import Settings, SettingsError, load_settings

__all__ = ["EnqueueError", "Ledger", "RequestSpec", "Settings", "SettingsError", "load_settings"]
