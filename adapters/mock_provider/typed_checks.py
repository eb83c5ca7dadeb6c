"""A request checked against a provider SDK's TypedDicts, as the provider's API checks it: every
key a TypedDict does not declare is refused, at any depth ("Extra inputs are not permitted"),
a required one missing ("Field required"), a value of the wrong kind or not among a `Literal`'s
("Input should be 'user' or 'assistant'"). The `anthropic` SDK's request types are TypedDicts.

Why not pydantic's TypeAdapter over them: it validates an `Iterable[...]` field lazily (an error
in `messages` surfaces only when something iterates it), and a TypedDict's `extra` cannot be set
from outside. The annotations are compiled once into nested checks, a few microseconds a request.
Types a JSON body cannot carry (file objects, paths) match nothing.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Callable
from typing import Any

import pydantic
import typing_extensions

Check = Callable[[Any], None]  # raises Invalid


class Invalid(ValueError):
    """Where (keys from the body's top) and what is wrong, in pydantic's words as the API says them."""

    def __init__(self, message: str, path: list[str | int] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str | int] = path or []

    def said(self) -> str:
        where = ".".join(str(p) for p in self.path)
        return f"{where}: {self.message}" if where else self.message


_WRAPPERS = {typing_extensions.Required, typing_extensions.NotRequired, typing.Required, typing.NotRequired}
_SEQUENCES = {
    collections.abc.Iterable,
    collections.abc.Sequence,
    list,
    typing.List,  # noqa: UP006 (what an SDK may write)
}
_KINDS: dict[type, tuple[Callable[[Any], bool], str]] = {
    str: (lambda v: isinstance(v, str), "Input should be a valid string"),
    bool: (lambda v: isinstance(v, bool), "Input should be a valid boolean"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "Input should be a valid integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "Input should be a valid number"),
}


def _unwrap(hint: Any) -> Any:
    while True:
        origin = typing_extensions.get_origin(hint)
        if origin in _WRAPPERS or origin is typing_extensions.Annotated:
            hint = typing_extensions.get_args(hint)[0]
        elif isinstance(hint, typing_extensions.TypeAliasType):
            hint = hint.__value__
        else:
            return hint


def _nested(check: Check, key: str | int, value: Any) -> None:
    try:
        check(value)
    except Invalid as exc:
        exc.path.insert(0, key)
        raise


class TypedChecks:
    """Compiles annotations into checks, each type once (recursive types allowed)."""

    def __init__(self) -> None:
        self._done: dict[Any, Check] = {}

    def check(self, hint: Any) -> Check:
        hint = _unwrap(hint)
        try:
            return self._done[hint]
        except (KeyError, TypeError):
            pass
        cell: list[Check] = []
        self._done[hint] = lambda v: cell[0](v)  # a recursive use, resolved below
        cell.append(self._compile(hint))
        self._done[hint] = cell[0]
        return cell[0]

    def _compile(self, hint: Any) -> Check:
        if hint is Any or hint is object:
            return lambda v: None
        if hint is None or hint is type(None):
            return _none
        if typing_extensions.is_typeddict(hint):
            return self._typed_dict(hint)
        origin = typing_extensions.get_origin(hint)
        args = typing_extensions.get_args(hint)
        if origin is typing_extensions.Literal or origin is typing.Literal:
            return _literal(args)
        if origin is typing.Union or origin is types.UnionType:
            return self._union(args)
        if origin in _SEQUENCES or getattr(origin, "__name__", "") == "SequenceNotStr":
            return self._sequence(args[0] if args else Any)
        if origin in (dict, collections.abc.Mapping):
            return self._mapping(args[1] if len(args) == 2 else Any)
        if hint in _KINDS:
            test, message = _KINDS[hint]
            return lambda v: None if test(v) else _fail(message)
        return lambda v: _fail(f"Input should be {getattr(hint, '__name__', hint)}")  # nothing JSON carries

    def _typed_dict(self, cls: Any) -> Check:
        hints = typing_extensions.get_type_hints(cls, include_extras=True)
        fields = {name: self.check(hint) for name, hint in hints.items()}
        required = _required_keys(cls, hints)

        def typed_dict(value: Any) -> None:
            if not isinstance(value, dict):
                _fail("Input should be a valid dictionary")
            for key, item in value.items():
                check = fields.get(key)
                if check is None:
                    raise Invalid("Extra inputs are not permitted", [key])
                _nested(check, key, item)
            for key in required:
                if key not in value:
                    raise Invalid("Field required", [key])

        typed_dict.__dict__["tags"] = _tags(hints)
        return typed_dict

    def _union(self, args: tuple[Any, ...]) -> Check:
        members = [self.check(a) for a in args if not _is_model(_unwrap(a))]
        tags: list[dict[str, Any]] = [getattr(m, "tags", {}) for m in members]
        field = next((f for f in ("type", "role") if len(members) > 1 and all(f in t for t in tags)), None)
        if field is not None:
            by_tag: dict[Any, list[Check]] = {}
            for member, tag in zip(members, tags, strict=True):
                by_tag.setdefault(tag[field], []).append(member)
            return _tagged({tag: _first_of(found) for tag, found in by_tag.items()}, field)
        return _first_of(members)

    def _sequence(self, item: Any) -> Check:
        check = self.check(item)

        def sequence(value: Any) -> None:
            if not isinstance(value, list):
                _fail("Input should be a valid list")
            for i, entry in enumerate(value):
                _nested(check, i, entry)

        return sequence

    def _mapping(self, item: Any) -> Check:
        check = self.check(item)

        def mapping(value: Any) -> None:
            if not isinstance(value, dict):
                _fail("Input should be a valid dictionary")
            for key, entry in value.items():
                _nested(check, key, entry)

        return mapping


def _is_model(hint: Any) -> bool:
    """An SDK's answer type (a pydantic model, or a union of them): a union of request types may
    also take one (an answer's content block given back), which the SDK writes out as the
    request type it matches; on the wire only the request types are meant."""
    if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
        return True
    args = typing_extensions.get_args(hint)
    return typing_extensions.get_origin(hint) in (typing.Union, types.UnionType) and all(
        _is_model(_unwrap(a)) for a in args
    )


def _required_keys(cls: Any, hints: dict[str, Any]) -> tuple[str, ...]:
    """A TypedDict's required keys. Not `__required_keys__`: with postponed annotations (the SDKs'
    `from __future__ import annotations`), Python 3.11 cannot see `Required[...]` in them. A key
    is required when marked so, or declared (not `NotRequired`) in a `total` class."""
    inherited: set[str] = set()  # declared by a base, required or not as the base says
    required: set[str] = set()
    for base in getattr(cls, "__orig_bases__", ()):
        if typing_extensions.is_typeddict(base):
            base_hints = typing_extensions.get_type_hints(base, include_extras=True)
            inherited.update(base_hints)
            required.update(_required_keys(base, base_hints))
    for name, hint in hints.items():
        origin = typing_extensions.get_origin(hint)
        marked = origin in (typing.Required, typing_extensions.Required)
        optional = origin in (typing.NotRequired, typing_extensions.NotRequired)
        if marked or (name not in inherited and cls.__total__ and not optional):
            required.add(name)
    return tuple(sorted(required))


def _fail(message: str) -> typing.NoReturn:
    raise Invalid(message)


def _none(value: Any) -> None:
    if value is not None:
        _fail("Input should be None")


def _literal(allowed: tuple[Any, ...]) -> Check:
    said = " or ".join(repr(a) for a in allowed) if len(allowed) < 3 else ", ".join(repr(a) for a in allowed[:-1])
    if len(allowed) >= 3:
        said += f" or {allowed[-1]!r}"
    choices = frozenset(allowed)

    def literal(value: Any) -> None:
        if isinstance(value, (dict, list)) or isinstance(value, bool) != any(isinstance(a, bool) for a in allowed):
            _fail(f"Input should be {said}")
        if value not in choices:
            _fail(f"Input should be {said}")

    return literal


def _tags(hints: dict[str, Any]) -> dict[str, Any]:
    """A TypedDict's tags: its fields that hold one Literal value (`type`, `role`)."""
    found: dict[str, Any] = {}
    for name in ("type", "role"):
        hint = _unwrap(hints.get(name))
        args = typing_extensions.get_args(hint)
        if typing_extensions.get_origin(hint) in (typing.Literal, typing_extensions.Literal) and len(args) == 1:
            found[name] = args[0]
    return found


def _first_of(members: list[Check]) -> Check:
    """A union tried member by member; when none holds, the error that went deepest into a
    container (what the value was most likely meant to be)."""
    if len(members) == 1:
        return members[0]

    def union(value: Any) -> None:
        best: Invalid | None = None
        for member in members:
            try:
                member(value)
                return
            except Invalid as exc:
                if best is None or len(exc.path) > len(best.path):
                    best = exc
        assert best is not None
        raise best

    return union


def _tagged(by_tag: dict[Any, Check], field: str) -> Check:
    """A union of TypedDicts told apart by their `type` or `role` (pydantic's tagged union, as the
    API has it)."""
    expected = ", ".join(repr(t) for t in by_tag)

    def tagged(value: Any) -> None:
        if not isinstance(value, dict):
            _fail("Input should be a valid dictionary")
        if field not in value:
            _fail(f"Unable to extract tag using discriminator '{field}'")
        check = by_tag.get(value[field]) if isinstance(value[field], str) else None
        if check is None:
            tag = value[field]
            _fail(f"Input tag {tag!r} found using '{field}' does not match any of the expected tags: {expected}")
        check(value)

    return tagged
