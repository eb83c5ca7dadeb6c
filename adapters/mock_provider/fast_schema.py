"""A JSON schema compiled into plain Python checks: whether an instance is valid, at a few
microseconds a request, where `jsonschema` takes a third of a millisecond (it re-enters its
validator for every keyword of every subschema). The mock checks every request, and every line of
a 100,000-line batch, so the yes/no question is asked here; `jsonschema` is asked only about a
request this finds invalid, to say what is wrong (and has the last word: a request it finds
valid is answered). The tests hold both to the same verdicts.

Only the keywords OpenAI's vendored schemas use are compiled (`format` is an annotation in JSON
Schema 2020-12, as `jsonschema` treats it by default); a schema with any other keyword is refused
at compile time (`Unsupported`), and its caller falls back to `jsonschema` alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_IGNORED = {"format", "$schema", "$comment", "contentMediaType", "contentEncoding", "readOnly", "writeOnly"}


class Unsupported(ValueError):
    """A keyword this compiler does not know."""


def _is_integer(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": _is_integer,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def _same(a: Any, b: Any) -> bool:
    """JSON equality: `true` is not `1`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)


def _all(checks: list[Check]) -> Check:
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]

    def every(value: Any) -> bool:  # a loop: `all()` over a generator costs twice as much here
        for check in checks:  # noqa: SIM110
            if not check(value):
                return False
        return True

    return every


class Compiler:
    """Compiles the schemas of one `$defs` table; each definition once (recursion allowed)."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self._done: dict[str, Check] = {}

    def definition(self, name: str) -> Check:
        if name not in self._done:
            cell: list[Check] = []
            self._done[name] = lambda v: cell[0](v)  # a recursive reference, resolved below
            cell.append(self.schema(self.defs[name]))
            self._done[name] = cell[0]
        return self._done[name]

    def schema(self, node: Any) -> Check:
        if node is True or node == {}:
            return lambda v: True
        if node is False:
            return lambda v: False
        checks: list[Check] = []
        for key, value in node.items():
            if key in _IGNORED or key in ("then", "else", "properties", "additionalProperties"):
                continue
            maker = getattr(self, "_" + key.lstrip("$"), None)
            if maker is None:
                raise Unsupported(key)
            checks.append(maker(value, node))
        if "properties" in node or "additionalProperties" in node:
            checks.append(self._object(node))
        return _all(checks)

    # -- keywords -----------------------------------------------------------------

    def _ref(self, value: str, node: dict[str, Any]) -> Check:
        return self.definition(value.removeprefix("#/$defs/"))

    def _type(self, value: str | list[str], node: dict[str, Any]) -> Check:
        if isinstance(value, str):
            return _TYPES[value]
        kinds = [_TYPES[k] for k in value]
        return lambda v: any(k(v) for k in kinds)

    def _enum(self, value: list[Any], node: dict[str, Any]) -> Check:
        if all(isinstance(e, str) for e in value):
            allowed = frozenset(value)
            return lambda v: isinstance(v, str) and v in allowed
        return lambda v: any(_same(v, e) for e in value)

    def _const(self, value: Any, node: dict[str, Any]) -> Check:
        return lambda v: _same(v, value)

    def _required(self, value: list[str], node: dict[str, Any]) -> Check:
        names = frozenset(value)
        return lambda v: not isinstance(v, dict) or names.issubset(v.keys())

    def _object(self, node: dict[str, Any]) -> Check:
        props = {name: self.schema(sub) for name, sub in node.get("properties", {}).items()}
        extra = node.get("additionalProperties", True)
        other = None if extra is True else self.schema(extra)

        def obj(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            for key, item in v.items():
                check = props.get(key, other)
                if check is not None and not check(item):
                    return False
            return True

        return obj

    def _items(self, value: Any, node: dict[str, Any]) -> Check:
        item = self.schema(value)

        def items(v: Any) -> bool:
            if isinstance(v, list):
                for x in v:
                    if not item(x):
                        return False
            return True

        return items

    def _anyOf(self, value: list[Any], node: dict[str, Any]) -> Check:
        branches = [self.schema(b) for b in value]

        def any_of(v: Any) -> bool:
            for branch in branches:  # noqa: SIM110
                if branch(v):
                    return True
            return False

        return any_of

    def _allOf(self, value: list[Any], node: dict[str, Any]) -> Check:
        return _all([self.schema(b) for b in value])

    def _not(self, value: Any, node: dict[str, Any]) -> Check:
        inner = self.schema(value)
        return lambda v: not inner(v)

    def _if(self, value: Any, node: dict[str, Any]) -> Check:
        test = self.schema(value)
        then = self.schema(node.get("then", True))
        otherwise = self.schema(node.get("else", True))
        return lambda v: then(v) if test(v) else otherwise(v)

    def _minLength(self, value: int, node: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, str) or len(v) >= value

    def _maxLength(self, value: int, node: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, str) or len(v) <= value

    def _minItems(self, value: int, node: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, list) or len(v) >= value

    def _maxItems(self, value: int, node: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, list) or len(v) <= value

    def _maxProperties(self, value: int, node: dict[str, Any]) -> Check:
        return lambda v: not isinstance(v, dict) or len(v) <= value

    def _propertyNames(self, value: Any, node: dict[str, Any]) -> Check:
        name = self.schema(value)
        return lambda v: not isinstance(v, dict) or all(name(k) for k in v)

    def _minimum(self, value: float, node: dict[str, Any]) -> Check:
        return lambda v: not _TYPES["number"](v) or v >= value

    def _maximum(self, value: float, node: dict[str, Any]) -> Check:
        return lambda v: not _TYPES["number"](v) or v <= value

    def _exclusiveMinimum(self, value: float, node: dict[str, Any]) -> Check:
        return lambda v: not _TYPES["number"](v) or v > value

    def _exclusiveMaximum(self, value: float, node: dict[str, Any]) -> Check:
        return lambda v: not _TYPES["number"](v) or v < value

    def _pattern(self, value: str, node: dict[str, Any]) -> Check:
        found = re.compile(value).search
        return lambda v: not isinstance(v, str) or found(v) is not None
