"""The columns an answer fills, written alike by the online recorder (`queue.py`) and by provider
batch mapping (`batch_results.py`).

An answer (`adapters.base.CallResult`) reaches the store as the values of one row of a
`bound_rows` set: `answer_row` makes them, `answer_columns` declares them, and `answer_values`
says which request column each one fills. The body goes as the JSON text the provider sent
(`CallResult.response_text`), never parsed and written out again.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Integer, String, Text, column
from sqlalchemy.sql.expression import ColumnClause

from ledger.store.dialect import db_now, json_text, jsonb_text, storable

# Tool calls as JSON text (escaped: a NUL or a lone surrogate in their arguments stays an escape,
# which PostgreSQL's jsonb takes as text and SQLite keeps).
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def answer_columns() -> list[ColumnClause[Any]]:
    """The answer's fields beside its text, usage and cost (which each set declares itself)."""
    return [
        column("tcached", Integer),
        column("twrite", Integer),
        column("treason", Integer),
        column("finish", String),
        column("pfinish", String),
        column("tools", Text),  # as JSON text: a set without JSON values binds fastest (`RowSet.flat`)
        column("refusal", Text),
        column("thinking", Text),
        column("resp", Text),  # the body's JSON text as it came (a JSON column: `json_text`)
    ]


# The request columns an answer fills beside its text, usage and cost: the one list of them, which
# the response cache copies (`cache.py`) and `ledger show` prints apart (`cli_requests.py`).
ANSWER_FIELDS = (
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "finish_reason",
    "provider_finish_reason",
    "tool_calls",
    "refusal",
    "thinking",
    "response",
)


def answer_values(v: Any) -> dict[str, Any]:
    """Request column (`ANSWER_FIELDS`, in order) -> the bound set's column (`v`: the set's `.c`)."""
    bound = (
        v.tcached,
        v.twrite,
        v.treason,
        v.finish,
        v.pfinish,
        jsonb_text(v.tools),  # JSONB on PostgreSQL: queried in audits
        v.refusal,
        v.thinking,
        json_text(v.resp),
    )
    return dict(zip(ANSWER_FIELDS, bound, strict=True))


def answer_row(answer: Any) -> dict[str, Any]:
    """An answer's fields as one row's values (None: an answer known only by its text and usage).

    Every text goes through `storable` (a NUL or an unpaired surrogate would make PostgreSQL
    refuse the whole group commit); the body and the tool calls are JSON text, which keeps such
    characters escaped."""
    if answer is None:
        return {}
    calls = answer.tool_calls
    return {
        "tcached": answer.cached_input_tokens,
        "twrite": answer.cache_write_tokens,
        "treason": answer.reasoning_tokens,
        "finish": answer.finish_reason,
        "pfinish": storable(answer.provider_finish_reason[:100]) if answer.provider_finish_reason else None,
        "tools": _ENCODE([c.as_json() for c in calls]) if calls else None,
        "refusal": storable(answer.refusal),
        "thinking": storable(answer.thinking),
        "resp": body_text(answer),
    }


def body_text(answer: Any) -> str | None:
    """The answer's body as JSON text: as received where the adapter kept it (valid JSON: it was
    parsed; a NUL or a lone surrogate in it stays an escape, which plain `json` keeps), else
    written out from the parsed body."""
    if answer.response_text is not None:
        return str(answer.response_text)
    return None if answer.response is None else _ENCODE(answer.response)


def derived_columns() -> list[ColumnClause[Any]]:
    """A parsed answer's fields (`ledger.parsing.derive`), written with the answer."""
    return [
        column("reasoning", Text),
        column("verdict_text", Text),
        column("verdict", Text),  # JSON text, as the answer's own JSON values go (`jsonb_text`)
        column("perror", Text),
        column("parsed", Text),
    ]


def derived_values(v: Any) -> dict[str, Any]:
    """Request column -> the bound set's column for a parsed answer's fields; `parsed_at` now."""
    return {
        "reasoning": v.reasoning,
        "verdict_text": v.verdict_text,
        "parsed_verdict": jsonb_text(v.verdict),
        "parse_error": v.perror,
        "parsed": jsonb_text(v.parsed),
        "parsed_at": db_now(),
    }


def derived_row(request_id: int, derived: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A parsed answer's fields as one row of a `derived_columns` set (texts made storable)."""
    return {
        "id": request_id,
        "reasoning": storable(derived.get("reasoning")),
        "verdict_text": storable(derived.get("verdict_text")),
        "verdict": _json_or_none(derived.get("parsed_verdict")),
        "perror": storable(derived.get("parse_error")),
        "parsed": _json_or_none(derived.get("parsed")),
        **more,
    }


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _ENCODE(value)
