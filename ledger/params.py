"""Sampling parameters checked where a request enters the ledger, not at call time.

A request with `max_tokens: 0` or `temperature: 7` would otherwise sit in the queue and
fail at the provider hours later (or, for `max_tokens: 10**9`, make every budget
reservation absurd). The rules cover the parameters the providers share; others pass
through as given. The same rules serve JSONL lines, the Python API and spec files.
"""

from __future__ import annotations

import math
from typing import Any

MAX_TOKENS_LIMIT = 1_000_000

# name -> (integer only, lowest, highest)
_RANGES: dict[str, tuple[bool, float, float]] = {
    "max_tokens": (True, 1, MAX_TOKENS_LIMIT),
    "max_completion_tokens": (True, 1, MAX_TOKENS_LIMIT),
    "max_output_tokens": (True, 1, MAX_TOKENS_LIMIT),
    "temperature": (False, 0, 2),
    "top_p": (False, 0, 1),
    "top_k": (True, 1, MAX_TOKENS_LIMIT),
    "presence_penalty": (False, -2, 2),
    "frequency_penalty": (False, -2, 2),
    "top_logprobs": (True, 0, 20),
    "seed": (True, -(2**63), 2**63 - 1),
}


def show(value: Any) -> str:
    """A value for an error line, as JSON would write it (strings quoted)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, str | int | float):
        return repr(value)
    return "an object" if isinstance(value, dict) else "an array" if isinstance(value, list) else type(value).__name__


def param_problem(name: str, value: Any) -> str | None:
    """What is wrong with one parameter's value, or None."""
    if name == "n":
        if value == 1 and not isinstance(value, bool):
            return None
        return f"only 1 is supported (one answer per request; enqueue n requests instead), got {show(value)}"
    rule = _RANGES.get(name)
    if rule is None:
        return None
    integer, low, high = rule
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    fits = not isinstance(value, float) or (not integer and math.isfinite(value))
    if numeric and fits and low <= value <= high:
        return None
    kind = "an integer" if integer else "a number"
    return f"must be {kind} in {_num(low)}..{_num(high)}, got {show(value)}"


def params_problem(params: dict[str, Any]) -> tuple[str, str] | None:
    """The first bad parameter as (name, problem), or None."""
    for name, value in params.items():
        problem = param_problem(name, value)
        if problem is not None:
            return name, problem
    return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
