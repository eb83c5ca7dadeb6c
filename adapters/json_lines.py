"""JSON lines, read and written fast: a batch's result file streamed line by line (never whole in
memory), a result line's answer body found as the JSON text the store writes, and an input entry
written compactly. Every provider's batch adapter uses them, and their speed is measured
(docs/benchmarks.md): what they do differently from `json.loads` is for that.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from typing import Any

import orjson

_READ_BYTES = 64 * 1024  # a streamed result file is read this much at a time


async def nonblank_lines(opened: AbstractAsyncContextManager[Any]) -> AsyncGenerator[bytes, None]:
    """The non-blank lines of a streamed download (an SDK's `with_streaming_response` call),
    read as they arrive: a result file is never whole in memory.

    Lines are split from the raw bytes, not decoded to text first: JSONL is UTF-8 and
    `json.loads` takes bytes, and the SDK's text line decoder was a fifth of the time
    spent mapping a 100,000-line result file."""
    async with opened as response:
        partial: list[bytes] = []  # the line being read, in pieces: a long one is joined once
        async for chunk in response.iter_bytes(_READ_BYTES):
            if b"\n" not in chunk:
                partial.append(chunk)
                continue
            lines = chunk.split(b"\n")
            lines[0] = b"".join([*partial, lines[0]])
            partial = [lines.pop()]
            for line in lines:
                if line.strip():
                    yield line
        rest = b"".join(partial)
        if rest.strip():
            yield rest


_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # the C scanner: (value, end) from an index


# A run of 19 digits, found as a run of zeros once every digit is one (a regular expression
# took five times as long).
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


_NINETEEN_DIGITS = b"0" * 19


def json_and_text_at(line: str | bytes, path: tuple[str, ...]) -> tuple[Any, str | None]:
    """A JSON document parsed, and the value at `path` (object keys) as JSON text: a batch result
    line's answer body, for the store to write as it is (the body is never parsed or written out
    again on the way to the database).

    orjson parses the line and writes the value out again (the same JSON, compact: a tenth of
    what the json module took to find the value's span and parse around it, which was a third of
    the event loop's time per mapped line). A document orjson refuses (a lone surrogate escape,
    NaN) goes to `_json_and_span_at`, which keeps the value's text as it
    stands in the document; so does one with a run of 19 digits or more, which might be an
    integer orjson would read as a float."""
    if _NINETEEN_DIGITS in (line if isinstance(line, bytes) else line.encode()).translate(_DIGITS_AS_ZERO):
        return _json_and_span_at(line, path)
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return _json_and_span_at(line, path)
    node = obj
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return obj, None
    return obj, orjson.dumps(node).decode()


def _json_and_span_at(line: str | bytes, path: tuple[str, ...]) -> tuple[Any, str | None]:
    """`json_and_text_at` with the json module, the value's text as it stands in the document.

    The value is parsed where its key is found, the rest of the document with a `null` in its
    place; then the rest must hold that `null` at `path`, or the key found was another one (in a
    string, in another object) and the document is parsed plainly (text None). Either way every
    byte is parsed once."""
    text = line.decode("utf-8") if isinstance(line, bytes) else line
    marker = json.dumps(path[-1])
    at = text.find(marker)
    while at != -1:
        colon = at + len(marker)
        while colon < len(text) and text[colon] in " \t\r\n":
            colon += 1
        if colon < len(text) and text[colon] == ":":
            start = colon + 1
            while start < len(text) and text[start] in " \t\r\n":
                start += 1
            try:
                value, end = _SCAN(text, start)
                rest = json.loads(text[:start] + "null" + text[end:])
            except (ValueError, StopIteration):
                break
            node = rest
            for key in path[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and path[-1] in node and node[path[-1]] is None:
                node[path[-1]] = value
                return rest, text[start:end]
            break
        at = text.find(marker, at + 1)
    return json.loads(text), None


def compact_json(obj: Any) -> bytes:
    """One batch input entry: JSON without spaces, UTF-8 as is (input files are sized in bytes)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
