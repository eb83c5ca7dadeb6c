"""OpenAI's own definitions of what the mock provider takes and answers: JSON schemas vendored from
OpenAI's published OpenAPI spec, compiled once into validators.

`openai_schemas.json` (shipped beside this module) holds the component schemas the mock needs and
everything they reference, copied from `openapi.json` of github.com/openai/openai-openapi (its
commit, OpenAPI and API versions are named in the file's `source`), with the annotations left out
(descriptions, examples, titles, defaults, `x-*` keys). The batch file's line shapes
(`BatchRequestInput`, `BatchRequestOutput`) are no longer in today's spec: they are copied from the
last commit that had them (`batch_lines_source`).

The spec is OpenAPI 3.1 (JSON Schema 2020-12 with a few OpenAPI words). When compiled here:
`nullable: true` admits null; a `oneOf` with a `discriminator` picks its branch by the
discriminating property's value (as OpenAI's server does), so an error names what is wrong in the
branch the request chose rather than "matches none of six"; a `oneOf` without one becomes `anyOf`
(some of the spec's branches overlap, which a strict `oneOf` would refuse); `$recursiveRef: "#"`
refers to the component it is written in.

To vendor a newer spec (from a checkout of openai/openai-openapi):

    python -m adapters.mock_provider.openai_spec openapi.json COMMIT
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

# The schemas the mock checks requests and answers against (their references come along).
ROOTS = (
    "CreateChatCompletionRequest",
    "CreateResponse",
    "CreateBatchRequest",
    "CreateFileRequest",
    "CreateChatCompletionResponse",
    "Response",
    "Batch",
    "OpenAIFile",
    "ErrorResponse",
)
VENDORED = "openai_schemas.json"
_PREFIX = "#/components/schemas/"
_ANNOTATIONS = {"description", "example", "examples", "title", "default", "deprecated"}


# -- vendoring ------------------------------------------------------------------


def _strip(node: Any) -> Any:
    """A schema without its annotations (inside `properties`, every key is a property's name)."""
    if isinstance(node, list):
        return [_strip(item) for item in node]
    if not isinstance(node, dict):
        return node
    kept: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties", "$defs"):
            kept[key] = {name: _strip(sub) for name, sub in value.items()}
        elif key not in _ANNOTATIONS and not key.startswith("x-"):
            kept[key] = _strip(value)
    return kept


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(_PREFIX):
                yield value.removeprefix(_PREFIX)
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)


def extract(spec: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    """The component schemas `roots` need, annotations left out."""
    components: dict[str, Any] = spec["components"]["schemas"]
    wanted: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted[name] = _strip(components[name])
            todo.extend(_references(wanted[name]))
    return dict(sorted(wanted.items()))


def vendor(spec_path: str, commit: str) -> dict[str, Any]:
    """The vendored file's content from a spec file; the batch line shapes are kept from the
    file already vendored (today's spec has none)."""
    with open(spec_path) as f:
        spec = json.load(f)
    old = _vendored()
    schemas = extract(spec, ROOTS)
    for name in ("BatchRequestInput", "BatchRequestOutput"):
        schemas[name] = old["schemas"][name]
    source = {
        "repository": "openai/openai-openapi",
        "file": "openapi.json",
        "commit": commit,
        "openapi": spec["openapi"],
        "version": spec["info"]["version"],
    }
    return {"source": source, "batch_lines_source": old["batch_lines_source"], "schemas": schemas}


# -- compiling --------------------------------------------------------------------


def _vendored() -> dict[str, Any]:
    text = resources.files("adapters.mock_provider").joinpath(VENDORED).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _branch_values(branch: dict[str, Any], prop: str, schemas: dict[str, Any]) -> list[Any] | None:
    """The values of the discriminating property a `oneOf` branch takes (None: cannot tell)."""
    target = branch
    while "$ref" in target and len(target) == 1:
        target = schemas[target["$ref"].removeprefix(_PREFIX)]
    parts = [target, *target.get("allOf", [])]
    for part in parts:
        while isinstance(part, dict) and "$ref" in part and len(part) == 1:
            part = schemas[part["$ref"].removeprefix(_PREFIX)]
        named = part.get("properties", {}).get(prop) if isinstance(part, dict) else None
        if isinstance(named, dict):
            if "const" in named:
                return [named["const"]]
            if isinstance(named.get("enum"), list):
                return list(named["enum"])
    return None


def _discriminated(node: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any] | None:
    """A discriminated `oneOf` as JSON Schema: with the property present, its value must be one
    the branches name and the branch(es) naming it must hold; without it, any branch will do."""
    prop = node["discriminator"]["propertyName"]
    branches: list[dict[str, Any]] = node["oneOf"]
    by_value: dict[Any, list[dict[str, Any]]] = {}
    for branch in branches:
        values = _branch_values(branch, prop, schemas)
        if values is None:
            return None
        for value in values:
            by_value.setdefault(value, []).append(branch)
    chosen = [
        {"if": {"properties": {prop: {"const": value}}}, "then": picked[0] if len(picked) == 1 else {"anyOf": picked}}
        for value, picked in by_value.items()
    ]
    present = {"properties": {prop: {"enum": list(by_value)}}, "allOf": chosen}
    return {"if": {"type": "object", "required": [prop]}, "then": present, "else": {"anyOf": branches}}


def _convert(node: Any, schemas: dict[str, Any], home: str) -> Any:
    """OpenAPI 3.1's words in JSON Schema 2020-12 (`home`: the component being converted)."""
    if isinstance(node, list):
        return [_convert(item, schemas, home) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if node.pop("$recursiveRef", None) is not None:
        node["$ref"] = _PREFIX + home
    node.pop("$recursiveAnchor", None)
    if isinstance(node.get("$ref"), str):
        node["$ref"] = "#/$defs/" + node["$ref"].removeprefix(_PREFIX)
    if "oneOf" in node:
        picked = _discriminated(node, schemas) if "discriminator" in node else None
        branches = node.pop("oneOf")
        if picked is None:
            node["anyOf"] = branches
        else:
            node.setdefault("allOf", []).append(picked)
    node.pop("discriminator", None)
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            converted[key] = {name: _convert(sub, schemas, home) for name, sub in value.items()}
        else:
            converted[key] = _convert(value, schemas, home)
    if converted.pop("nullable", False):
        kind = converted.get("type")
        if isinstance(kind, str):
            converted["type"] = [kind, "null"]
        elif "enum" in converted:
            converted["enum"] = [*converted["enum"], None]
        elif kind is None:
            converted = {"anyOf": [converted, {"type": "null"}]}
    return converted


@cache
def definitions() -> dict[str, Any]:
    """Every vendored schema, converted, under `$defs` (the names are the spec's)."""
    schemas: dict[str, Any] = _vendored()["schemas"]
    return {name: _convert(copy.deepcopy(schema), schemas, name) for name, schema in schemas.items()}


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """The compiled validator of one vendored schema (built once per process)."""
    schema: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"#/$defs/{name}"}
    schema["$defs"] = definitions()
    return jsonschema.Draft202012Validator(schema)


@cache
def top_level_fields(name: str) -> frozenset[str]:
    """The property names a request schema declares at its top level (through `allOf`, `$ref`):
    OpenAI refuses any other argument."""
    found: set[str] = set()
    schemas = _vendored()["schemas"]

    def walk(node: dict[str, Any]) -> None:
        if "$ref" in node:
            walk(schemas[node["$ref"].removeprefix(_PREFIX)])
        found.update(node.get("properties", {}))
        for part in node.get("allOf", []):
            walk(part)

    walk(schemas[name])
    return frozenset(found)


def source() -> dict[str, Any]:
    """Where the vendored schemas come from (repository, commit, spec version)."""
    vendored = _vendored()
    return {"spec": vendored["source"], "batch_lines": vendored["batch_lines_source"]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m adapters.mock_provider.openai_spec OPENAPI_JSON COMMIT", file=sys.stderr)
        return 2
    content = vendor(args[0], args[1])
    target = resources.files("adapters.mock_provider").joinpath(VENDORED)
    with resources.as_file(target) as path:
        path.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
    print(f"{len(content['schemas'])} schemas from {args[1]} written to {VENDORED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
