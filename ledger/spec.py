"""Evaluation job specs: one TOML file naming the artifact, the judges and the dimensions.

A spec is read once, when the job is triggered: the artifact's text is read at that
moment and the whole spec is stored as JSON in the jobs table (`JobSpec.to_json`),
so a job resumed after a crash, or on another host, never needs the files again.

Every problem is one line, `<file>: <key>: <problem>`, raised as `SpecError`: an
operator fixes the file from that line alone, without reading a traceback. The
checks are written by hand rather than with pydantic because the exact key path
(`agents[1].params.max_tokens`) and TOML's own type names are the whole message.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, TypeVar

from adapters.registry import PROVIDER_NAMES
from ledger.deadlines import parse_deadline
from ledger.params import params_problem

_T = TypeVar("_T")

DELIVERIES = ("online", "batch", "auto")
# Judges score every dimension with an integer on this scale; not configurable, so
# scores from different jobs can be compared with plain SQL.
SCORE_MIN, SCORE_MAX = 1, 5

_JOB_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_JOB_ID_RULE = "1-200 letters, digits or . _ : -"
_TOP_KEYS = ("id", "delivery", "deadline", "budget_usd", "artifact", "agents", "dimensions", "cache", "samples")
_ARTIFACT_KEYS = ("path", "text")
_AGENT_KEYS = ("name", "provider", "model", "system", "params")
_DIMENSION_KEYS = ("id", "name", "instruction", "success", "failure")
# TOML's own names, so a message speaks the language of the file being fixed
# (datetime before date: it is a subclass).
_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (str, "string"), (int, "integer"), (float, "float"), (list, "array"), (Mapping, "table"),
    (datetime, "datetime"), (date, "date"), (time, "time"),
)  # fmt: skip


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line naming the file, the key and the problem."""


@dataclass(frozen=True)
class AgentSpec:
    """One judge: who it is (`system`), which model plays it, and that model's parameters."""

    name: str
    provider: str
    model: str
    system: str
    params: dict[str, Any]


@dataclass(frozen=True)
class DimensionSpec:
    """One thing every judge scores; `success`/`failure` describe the ends of the 1-5 scale."""

    id: str
    name: str
    instruction: str
    success: str | None
    failure: str | None


@dataclass(frozen=True)
class JobSpec:
    """A validated job: everything the coordinator needs, with the artifact's text already read."""

    id: str
    delivery: str
    budget_usd: float | None
    artifact: str
    artifact_source: str
    agents: tuple[AgentSpec, ...]
    dimensions: tuple[DimensionSpec, ...]
    cache: bool = True  # False: every request called, never answered from the response cache
    samples: int = 1  # each (judge, dimension) asked this many times (samples 0..N-1)
    # Delivery `auto`: the deadline as an ISO-8601 UTC time, fixed when the spec was read (a
    # duration counts from then), so a resumed job keeps it. None: 24 hours from each enqueue.
    deadline: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values for the jobs table, so a resumed job never rereads the files."""
        return {
            "id": self.id,
            "delivery": self.delivery,
            "budget_usd": self.budget_usd,
            "artifact": self.artifact,
            "artifact_source": self.artifact_source,
            "agents": [asdict(agent) for agent in self.agents],
            "dimensions": [asdict(dimension) for dimension in self.dimensions],
            "cache": self.cache,
            "samples": self.samples,
            "deadline": self.deadline,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """The inverse of `to_json`. Not revalidated: a stored job must resume even if the rules tighten."""
        return cls(
            id=data["id"],
            delivery=data["delivery"],
            budget_usd=data["budget_usd"],
            artifact=data["artifact"],
            artifact_source=data["artifact_source"],
            agents=tuple(AgentSpec(**{**agent, "params": dict(agent["params"])}) for agent in data["agents"]),
            dimensions=tuple(DimensionSpec(**dimension) for dimension in data["dimensions"]),
            cache=bool(data.get("cache", True)),
            samples=int(data.get("samples", 1)),
            deadline=data.get("deadline"),
        )


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a TOML spec; the job id defaults to the file's stem."""
    source, path = str(path), Path(path)
    try:
        text = _read_utf8(path)
    except _Unreadable as exc:
        raise SpecError(f"{source}: cannot read spec file ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: invalid TOML: {' '.join(str(exc).split())}") from None
    return spec_from_mapping(data, source=source, base_dir=path.parent, default_id=path.stem)


def spec_from_mapping(data: Mapping[str, Any], *, source: str, base_dir: Path, default_id: str) -> JobSpec:
    """Validate a spec given as a mapping (a parsed file, or a dict built in Python).

    `source` starts every error line; a relative `artifact.path` is read from `base_dir`.
    """
    top = _Table(data, "", source, _TOP_KEYS)
    job_id = top.optional_text("id", single_line=True)
    if job_id is not None and not _JOB_ID.fullmatch(job_id):
        raise top.fail("id", f"must be {_JOB_ID_RULE}, got {job_id!r}")
    if job_id is None:
        if not _JOB_ID.fullmatch(default_id):
            raise top.fail("id", f"not set, and the default {default_id!r} is not {_JOB_ID_RULE}")
        job_id = default_id
    delivery = top.optional_text("delivery") or "online"
    if delivery not in DELIVERIES:
        raise top.fail("delivery", f"must be 'online', 'batch' or 'auto', got {delivery!r}")
    deadline = _deadline(top, delivery)
    budget = top.get("budget_usd")
    if budget is not None and (not _is_number(budget) or not math.isfinite(budget) or budget < 0):
        raise top.fail("budget_usd", f"must be a number >= 0, got {_show(budget)}")
    cache = top.get("cache")
    if cache is not None and not isinstance(cache, bool):
        raise top.fail("cache", f"must be true or false, got {_show(cache)}")
    samples = top.get("samples")
    if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or not 1 <= samples <= 100):
        raise top.fail("samples", f"must be an integer from 1 to 100, got {_show(samples)}")
    artifact, artifact_source = _artifact(_Table(top.need("artifact"), "artifact", source, _ARTIFACT_KEYS), base_dir)
    agents = _unique(_tables(top, "agents", _AGENT_KEYS), "name", _agent)
    dimensions = _unique(_tables(top, "dimensions", _DIMENSION_KEYS), "id", _dimension)
    return JobSpec(
        id=job_id,
        delivery=delivery,
        budget_usd=None if budget is None else float(budget),
        artifact=artifact,
        artifact_source=artifact_source,
        agents=agents,
        dimensions=dimensions,
        cache=cache is not False,
        samples=1 if samples is None else samples,
        deadline=deadline,
    )


def _deadline(top: _Table, delivery: str) -> str | None:
    """`deadline` (delivery `auto` only) as an ISO-8601 UTC time."""
    raw = top.get("deadline")  # a TOML date-time, or a string: a duration or an ISO-8601 time
    given = raw if isinstance(raw, datetime) else top.optional_text("deadline")
    if given is None:
        return None
    if delivery != "auto":
        raise top.fail("deadline", f"only with delivery 'auto', not {delivery!r}")
    try:
        return parse_deadline(given).isoformat()
    except ValueError as exc:
        raise top.fail("deadline", str(exc).removeprefix("deadline ")) from None


class _Table:
    """One table being read; it knows its place (`agents[1]`) so every error names the full key."""

    def __init__(self, data: object, where: str, source: str, allowed: tuple[str, ...]) -> None:
        self.where, self.source = where, source
        if not isinstance(data, Mapping):
            raise self.fail(None, f"expected a table, got {_kind(data)}")
        for key in data:
            if key not in allowed:
                raise self.fail(str(key), "unknown key")
        self.data: Mapping[str, Any] = data

    def fail(self, key: str | None, problem: str) -> SpecError:
        where = ".".join(part for part in (self.where, key) if part)
        return SpecError(f"{self.source}: {where}: {problem}" if where else f"{self.source}: {problem}")

    def get(self, key: str) -> Any:
        """The value, or None when absent (a None from Python counts as absent)."""
        return self.data.get(key)

    def need(self, key: str) -> Any:
        if self.data.get(key) is None:
            raise self.fail(None, f"missing key {key!r}")
        return self.data[key]

    def text(self, key: str, *, single_line: bool = False) -> str:
        return self._check_text(key, self.need(key), single_line)

    def optional_text(self, key: str, *, single_line: bool = False) -> str | None:
        value = self.get(key)
        return None if value is None else self._check_text(key, value, single_line)

    def _check_text(self, key: str, value: object, single_line: bool) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_kind(value)}")
        if not value.strip():
            raise self.fail(key, "must not be empty")
        if single_line and ("\n" in value or "\r" in value):
            raise self.fail(key, "must not contain a newline")
        return value


def _tables(top: _Table, key: str, allowed: tuple[str, ...]) -> list[_Table]:
    """The `[[key]]` entries; none at all is an error, since a job without judges or dimensions does nothing."""
    value = top.get(key)
    if value is None or value == []:
        raise top.fail(key, f"at least one [[{key}]] table is required")
    if not isinstance(value, list):
        raise top.fail(key, f"expected an array of tables ([[{key}]]), got {_kind(value)}")
    return [_Table(item, f"{key}[{index}]", top.source, allowed) for index, item in enumerate(value)]


def _unique(tables: list[_Table], key: str, build: Callable[[_Table], _T]) -> tuple[_T, ...]:
    """Build each entry in order; agent names and dimension ids key the opinions, so a repeat is an error."""
    items: list[_T] = []
    first: dict[str, str] = {}
    for table in tables:
        item = build(table)
        value = getattr(item, key)
        if value in first:
            raise table.fail(key, f"duplicate {key} {value!r} (first at {first[value]})")
        first[value] = table.where
        items.append(item)
    return tuple(items)


def _artifact(table: _Table, base_dir: Path) -> tuple[str, str]:
    """The artifact's text and where it came from: the path as written, or "inline"."""
    if ("path" in table.data) == ("text" in table.data):
        got = "both" if "path" in table.data else "neither"
        raise table.fail(None, f"needs exactly one of 'path' or 'text', got {got}")
    if "text" in table.data:
        return table.text("text"), "inline"
    raw = table.text("path")
    try:
        text = _read_utf8(base_dir / raw)  # an absolute path replaces base_dir
    except _Unreadable as exc:
        raise table.fail("path", f"cannot read {raw!r} ({exc})") from None
    if not text.strip():
        raise table.fail("path", f"{raw!r} is empty")
    return text, raw


def _agent(table: _Table) -> AgentSpec:
    name = table.text("name", single_line=True)
    provider = table.text("provider")
    if provider not in PROVIDER_NAMES:
        known = ", ".join(sorted(PROVIDER_NAMES))
        raise table.fail("provider", f"unknown provider {provider!r} (known: {known})")
    model, system = table.text("model"), table.text("system")
    return AgentSpec(name=name, provider=provider, model=model, system=system, params=_params(table))


def _params(agent: _Table) -> dict[str, Any]:
    """Model parameters pass through to the provider; those the providers share are checked here, not at call time."""
    raw = agent.get("params")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise agent.fail("params", f"expected a table, got {_kind(raw)}")
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(value, str | int | float) or (isinstance(value, float) and not math.isfinite(value)):
            # Dates and non-finite floats have no JSON form, and the spec is stored as JSON.
            raise agent.fail(f"params.{key}", f"expected a string, a finite number or a boolean, got {_show(value)}")
        params[str(key)] = value
    problem = params_problem(params)  # the same rules as every other way in (ledger/params.py)
    if problem is not None:
        raise agent.fail(f"params.{problem[0]}", problem[1])
    return params


def _dimension(table: _Table) -> DimensionSpec:
    return DimensionSpec(
        id=table.text("id", single_line=True),
        name=table.text("name"),
        instruction=table.text("instruction"),
        success=table.optional_text("success"),
        failure=table.optional_text("failure"),
    )


class _Unreadable(Exception):
    """Why a file cannot be read, in a few words fit for one line."""


def _read_utf8(path: Path) -> str:
    """The file's text (a leading BOM dropped), or `_Unreadable` with a few words fit for one line."""
    try:
        return path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise _Unreadable("no such file") from None
    except IsADirectoryError:
        raise _Unreadable("is a directory") from None
    except PermissionError:
        raise _Unreadable("permission denied") from None
    except UnicodeDecodeError as exc:
        raise _Unreadable(f"not UTF-8: invalid byte at offset {exc.start}") from None
    except (OSError, ValueError) as exc:
        raise _Unreadable(" ".join(str(getattr(exc, "strerror", None) or exc).split())) from None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: object) -> str:
    return next((name for kind, name in _KINDS if isinstance(value, kind)), type(value).__name__)


def _show(value: object) -> str:
    """A value for an error line: strings quoted, others by TOML kind when the value itself says little."""
    if isinstance(value, str | int | float):
        return repr(value) if not isinstance(value, bool) else str(value).lower()
    return _kind(value)
