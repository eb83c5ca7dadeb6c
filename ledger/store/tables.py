"""The ledger's tables as SQLAlchemy `Table`s, for the store's statements: one typed place.

The models (`ledger/models.py`) are SQLModel classes; SQLAlchemy gives each its `Table` as
`__table__`, which SQLModel's types do not declare. `table_of` is the one place that reads it,
so the modules that build statements import typed tables instead of repeating the lookup.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table
from sqlmodel import SQLModel

from ledger.models import (
    Job,
    LlmAttempt,
    LlmBatch,
    LlmPool,
    LlmPoolCall,
    LlmPoolOverride,
    LlmQuestionTurn,
    LlmRequest,
    LlmRequestSource,
    LlmSlot,
    LlmWorker,
    Opinion,
)


def table_of(model: type[SQLModel]) -> Table:
    """The `Table` SQLAlchemy made for a table model."""
    return cast(Table, model.__table__)  # type: ignore[attr-defined]


requests = table_of(LlmRequest)
attempts = table_of(LlmAttempt)
request_sources = table_of(LlmRequestSource)
batches = table_of(LlmBatch)
jobs = table_of(Job)
opinions = table_of(Opinion)
pools = table_of(LlmPool)
pool_calls = table_of(LlmPoolCall)
pool_overrides = table_of(LlmPoolOverride)
workers = table_of(LlmWorker)
question_turns = table_of(LlmQuestionTurn)
slots = table_of(LlmSlot)
