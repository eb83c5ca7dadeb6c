"""Derived fields from a request's stored raw output: the VERDICT and structured entries.

Pure functions, no I/O: the raw output stays on the request row and these can be
re-run at any time (a parser fix re-derives every result without a paid call).

Two answer contracts (see docs/parsing.md for the tables):
- `parse_verdict`: "reasoning, then a final line `VERDICT: <1-5>`". The
  last VERDICT line is the model's final answer, so it wins even when it does not
  parse; markdown a model likes to add around it is tolerated, ambiguity is not.
- `parse_structured`: one request asks for every dimension of one agent. Valid entries
  are kept, invalid ones are rejected with their raw JSON
  (for the WARNING log), and every asked dimension without a valid entry is listed
  in `missing`, to be retried as an individual call.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from adapters.token_limit import output_limit

SCORE_LOW = 1
SCORE_HIGH = 5
STRUCTURED_ARRAY_KEY = "evaluations"
RAW_LIMIT = 2000  # chars of a rejected entry or output kept for the log line

# `verdict` (not inside a word; `__VERDICT__` and `**Verdict*` still match), any
# markdown emphasis or backticks, then the colon.
_MARKER = re.compile(r"(?<![a-z])verdict[\s*_`]*:", re.IGNORECASE)
# After the marker: decoration, a number, an optional `/M` or `out of M` scale, the rest.
_VALUE = re.compile(
    r"""[\s*_`'"\[(]*
        (?P<num>[-+]?\d+(?:\.\d+)?)
        (?:\s*(?P<slash>/|\bout\s+of\b)\s*(?P<den>\d+)?)?
        (?P<rest>.*)""",
    re.IGNORECASE | re.VERBOSE,
)
# A second number right after the first: `3-4`, `3 or 4`, `3 to 4`, `3, 4`.
_SECOND_NUMBER = re.compile(r"[\s*_`\])]*(?:[-\u2013\u2014,/]|or\b|to\b|and\b)\s*[-+]?\d", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    """A parsed plain answer; `error` is set exactly when `score` is None."""

    reasoning: str | None
    verdict_text: str | None
    score: int | None
    error: str | None


def parse_verdict(raw: str | None, *, low: int = SCORE_LOW, high: int = SCORE_HIGH) -> Verdict:
    """The score of the last `VERDICT:` line, or why there is none."""
    if raw is None or not raw.strip():
        return Verdict(None, None, None, "empty output")
    lines = raw.splitlines()
    index = next((i for i in range(len(lines) - 1, -1, -1) if _MARKER.search(lines[i])), None)
    if index is None:
        return Verdict(None, None, None, "no VERDICT line")
    reasoning = "\n".join(lines[:index]).strip() or None
    line = lines[index].strip()
    score, error = _score(_MARKER.split(line)[-1], low, high)
    return Verdict(reasoning, line, score, error)


def _score(value: str, low: int, high: int) -> tuple[int | None, str | None]:
    """The score written after the marker: an integer in low..high or a fraction `N/M`."""
    match = _VALUE.match(value)
    if match is None:
        return None, f"no number after VERDICT: {value.strip()[:80]!r}"
    if _SECOND_NUMBER.match(match["rest"]):
        return None, f"ambiguous score (range or alternatives): {value.strip()[:80]!r}"
    number = Fraction(match["num"])
    if number.denominator != 1:
        return None, f"non-integer score {match['num']}"
    if match["slash"] is None:
        if not low <= number <= high:
            return None, f"score {number} outside {low}..{high}"
        return int(number), None
    if match["den"] is None:
        return None, f"fraction {match['num']}/? has no denominator"
    scale = int(match["den"])
    if scale == 0:
        return None, f"fraction {match['num']}/0 has a zero denominator"
    if not 0 <= number <= scale:
        return None, f"fraction {number}/{scale} outside 0..{scale}"
    # N/M → N*high/M rounded half up, clamped to low..high: N/5 is N, 7/10 is 4, 0/10 is 1.
    return min(max(math.floor(number * high / scale + Fraction(1, 2)), low), high), None


def evaluation_schema(dimension_ids: Sequence[str]) -> dict[str, Any]:
    """The OpenAI-style `response_format` asking for one entry per dimension, in one call.

    Strict mode requires every property to be listed in `required`, so
    `cited_evidence` is required here even though the parser tolerates its absence.
    """
    ids = list(dimension_ids)
    if not ids or len(set(ids)) != len(ids):
        raise ValueError(f"dimension ids must be non-empty and unique, got {ids}")
    entry = {
        "type": "object",
        "properties": {
            "criterion_id": {"type": "string", "enum": ids},
            "score": {"type": "integer", "minimum": SCORE_LOW, "maximum": SCORE_HIGH},
            "argument": {"type": "string"},
            "cited_evidence": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["criterion_id", "score", "argument", "cited_evidence"],
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {
            STRUCTURED_ARRAY_KEY: {"type": "array", "minItems": len(ids), "maxItems": len(ids), "items": entry}
        },
        "required": [STRUCTURED_ARRAY_KEY],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": STRUCTURED_ARRAY_KEY, "strict": True, "schema": schema}}


@dataclass(frozen=True)
class StructuredEntry:
    dimension: str
    score: int
    argument: str
    cited_evidence: tuple[str, ...]


@dataclass(frozen=True)
class RejectedEntry:
    """A discarded entry as compact JSON (or the raw output when it is not JSON), and why."""

    raw: str
    reason: str


@dataclass(frozen=True)
class StructuredParse:
    """Accepted entries in asked order; `missing` is what to retry one dimension at a time."""

    entries: dict[str, StructuredEntry]
    rejected: tuple[RejectedEntry, ...]
    missing: tuple[str, ...]
    error: str | None


def parse_structured(raw: str | None, dimension_ids: Sequence[str]) -> StructuredParse:
    """Partial success: keep every valid entry, reject the rest with a reason, list the gaps."""
    asked = list(dict.fromkeys(dimension_ids))
    document, error = _document(raw)
    if error is not None:
        return StructuredParse({}, (RejectedEntry(_truncate(raw or ""), error),), tuple(asked), error)
    found: dict[str, StructuredEntry] = {}
    rejected: list[RejectedEntry] = []
    for item in document:
        entry, reason = _entry(item, asked)
        if entry is not None and entry.dimension not in found:
            found[entry.dimension] = entry
            continue
        if entry is not None:
            reason = f"duplicate criterion_id {entry.dimension!r}"
        compact = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
        rejected.append(RejectedEntry(_truncate(compact), reason))
    entries = {dim: found[dim] for dim in asked if dim in found}
    return StructuredParse(entries, tuple(rejected), tuple(d for d in asked if d not in found), None)


def json_value(raw: str | None) -> tuple[Any, str | None]:
    """The JSON value an output holds (bare or in a ```json fence), or why there is none."""
    text = (raw or "").strip()
    if not text:
        return None, "empty output"
    fenced = re.fullmatch(r"```[a-zA-Z]*\s*\n(.*?)\n?\s*```", text, re.DOTALL)
    try:
        return json.loads(fenced[1] if fenced else text), None
    except json.JSONDecodeError as exc:
        return None, f"output is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return None, "output is not JSON: nested too deeply"


def _document(raw: str | None) -> tuple[list[Any], str | None]:
    """The `evaluations` array of the output (bare or in a ```json fence), or why not."""
    value, error = json_value(raw)
    if error is not None:
        return [], error
    items = value.get(STRUCTURED_ARRAY_KEY) if isinstance(value, dict) else None
    if not isinstance(items, list):
        return [], f'output has no "{STRUCTURED_ARRAY_KEY}" array'
    return items, None


def _entry(item: Any, asked: Sequence[str]) -> tuple[StructuredEntry | None, str]:
    """One validated entry, or None and the first reason it is not one."""
    if not isinstance(item, dict):
        return None, "entry is not an object"
    dimension, score, argument = item.get("criterion_id"), item.get("score"), item.get("argument")
    evidence = item.get("cited_evidence")
    if evidence is None:
        evidence = []  # strict providers always send it; a lenient one may omit it: no evidence cited
    if not isinstance(dimension, str):
        return None, "criterion_id missing or not a string"
    if dimension not in asked:
        return None, f"unknown criterion_id {dimension!r}"
    if type(score) is not int or not SCORE_LOW <= score <= SCORE_HIGH:
        return None, f"score {score!r} is not an integer in {SCORE_LOW}..{SCORE_HIGH}"
    if not isinstance(argument, str):
        return None, "argument missing or not a string"
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        return None, "cited_evidence is not a list of strings"
    return StructuredEntry(dimension, score, argument, tuple(evidence)), ""


def _truncate(text: str) -> str:
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + f"… [{len(text) - RAW_LIMIT} more chars]"


# -- a parser per request -----------------------------------------------------------------

PARSERS = ("verdict", "json")


def parse_name(kind: str, score_range: tuple[int, int] | None = None) -> str:
    """How a request's `parse` column names its parser: `verdict`, `verdict:LOW-HIGH` (a score
    range other than 1-5), or `json`."""
    if kind == "verdict" and score_range is not None and tuple(score_range) != (SCORE_LOW, SCORE_HIGH):
        return f"verdict:{score_range[0]}-{score_range[1]}"
    return kind


def read_parse_name(name: str) -> tuple[str, int, int]:
    """(parser, low, high) of a `parse` column's value."""
    kind, _, scale = name.partition(":")
    if not scale:
        return kind, SCORE_LOW, SCORE_HIGH
    low, _, high = scale.rpartition("-")
    return kind, int(low), int(high)


def derive(
    parse: str,
    raw: str | None,
    *,
    response_format: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The derived fields of a request whose answer is parsed by `parse` (its column's value):
    `verdict` gives reasoning, verdict text and score (`parsed_verdict`); `json` gives the
    answer's JSON value (`parsed`), checked against the request's JSON schema when it has one.
    A failure sets `parse_error` (said to be a cut-off when the answer was one) and leaves the
    raw output as it is."""
    kind, low, high = read_parse_name(parse)
    fields: dict[str, Any]
    if kind == "json":
        value, error = json_value(raw)
        if error is None:
            error = schema_problem(value, response_format)
        fields = {"reasoning": None, "verdict_text": None, "parsed_verdict": None}
        fields |= {"parsed": None if error else value, "parse_error": error}
    else:
        verdict = parse_verdict(raw, low=low, high=high)
        fields = {
            "reasoning": verdict.reasoning,
            "verdict_text": verdict.verdict_text,
            "parsed_verdict": verdict.score,
            "parse_error": verdict.error,
            "parsed": None,
        }
    fields["parse_error"] = cut_off(fields["parse_error"], finish_reason, params)
    return fields


def schema_problem(value: Any, response_format: dict[str, Any] | None) -> str | None:
    """Why a JSON value does not conform to a request's JSON schema (None: it does, or the
    request has none). The response format is chat's (`json_schema.schema`) or a bare schema."""
    schema = _schema_of(response_format)
    if schema is None:
        return None
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        error = next(iter(sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))), None)
    except SchemaError as exc:
        return f"the response format's schema is not valid: {exc.message}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(the whole value)"
    return f"does not match the schema at {where}: {error.message}"


def _schema_of(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return schema if isinstance(schema, dict) else None
    if response_format.get("type") in ("json_object", "text"):
        return None
    return response_format  # a bare schema


def cut_off(error: str | None, finish_reason: str | None, params: dict[str, Any] | None) -> str | None:
    """A parse error, saying so when the answer was cut off at its output limit (finish reason
    `length`): the parser is not to blame, the request's max_tokens is."""
    if error is None or finish_reason != "length":
        return error
    given = params or {}
    limit = output_limit(given)
    return f"answer cut off at max_tokens ({limit if limit else 'the provider default'}): {error}"
