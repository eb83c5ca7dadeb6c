"""Result lines of a provider batch: which belong to this ledger batch, and how their bytes are split."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import pytest

from adapters.anthropic import message_result
from adapters.json_lines import json_and_text_at, nonblank_lines
from adapters.openai import completion_result
from ledger.batches import custom_id, request_of


def test_a_line_of_this_batch_names_its_request() -> None:
    ours = request_of(12, "abc")
    assert ours(custom_id(12, "abc", 5)) == 5
    assert ours(custom_id(12, "abc", 123456789)) == 123456789


@pytest.mark.parametrize(
    "value",
    [
        custom_id(1, "abc", 5),  # another ledger batch whose id is a prefix of ours
        custom_id(123, "abc", 5),  # another ledger batch whose id starts with ours
        custom_id(12, "abd", 5),  # the same batch id written by another submission
        "b12-abc-r",
        "b12-abc-r05",
        "b12-abc-r1_0",  # int() would take it
        "b12-abc-r 5",
        "b12-abc-r\u0665",  # a non-ASCII digit
        "b12-abc-r5x",
        "request-5",
    ],
)
def test_a_foreign_custom_id_names_no_request(value: str) -> None:
    assert request_of(12, "abc")(value) is None


@dataclass
class _Streamed:
    chunks: list[bytes]

    async def iter_bytes(self, chunk_size: int | None = None) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


@pytest.mark.parametrize(
    "chunks",
    [
        [b'{"a": 1}\n{"b": "\xc3\xa9"}\n\n  \n{"c": 3}'],  # no newline at the end
        [b'{"a"', b': 1}\n{"b": "\xc3', b'\xa9"}\n', b"\n  \n", b'{"c": 3}\n'],  # cut anywhere, even in a character
        [b'{"a": 1}\r\n{"b": "\xc3\xa9"}\r\n\r\n{"c": 3}\r\n'],  # CRLF: json.loads takes the trailing \r
        [b'{"a"', b": ", b"1}", b'\n{"b": "\xc3\xa9"}\n{"c": 3}'],  # a line longer than one chunk
    ],
)
def test_lines_are_split_from_the_bytes_however_they_arrive(chunks: list[bytes]) -> None:
    @asynccontextmanager
    async def opened() -> AsyncIterator[_Streamed]:
        yield _Streamed(chunks)

    async def read() -> list[bytes]:
        return [line async for line in nonblank_lines(opened())]

    assert [json.loads(line) for line in anyio.run(read)] == [{"a": 1}, {"b": "\u00e9"}, {"c": 3}]


def test_a_separator_inside_a_json_string_does_not_split_its_line() -> None:
    """U+2028, U+2029 and U+0085 are line breaks to `str.splitlines`, not to JSONL."""
    text = '{"t": "a\u2028b\u2029c\u0085d"}\n{"t": "e"}\n'.encode()

    @asynccontextmanager
    async def opened() -> AsyncIterator[_Streamed]:
        yield _Streamed([text])

    async def read() -> list[bytes]:
        return [line async for line in nonblank_lines(opened())]

    assert [json.loads(line)["t"] for line in anyio.run(read)] == ["a\u2028b\u2029c\u0085d", "e"]


@pytest.mark.parametrize(
    ("sent", "kept"), [(12, 12), (12.0, 12), (7.6, 8), (None, None), ("12", None), (True, None), (float("nan"), None)]
)
def test_usage_counts_are_whole_numbers_whatever_the_server_sent(sent: object, kept: int | None) -> None:
    """Some OpenAI-compatible servers send `12.0`; PostgreSQL's integer columns refuse it from a
    JSON row, so a whole group of outcomes would fail to record (online answers and batch lines)."""
    openai_body = {
        "choices": [{"message": {"content": "x"}}],
        "usage": {"prompt_tokens": sent, "completion_tokens": sent},
    }
    result = completion_result(openai_body)
    assert (result.input_tokens, result.output_tokens) == (kept, kept)
    assert kept is None or type(result.input_tokens) is int  # 12.0 == 12, but not as a JSON row
    anthropic_body = {
        "content": [{"type": "text", "text": "x"}],
        "usage": {"input_tokens": sent, "output_tokens": sent},
    }
    answer = message_result(anthropic_body)
    assert (answer.text, answer.input_tokens, answer.output_tokens) == ("x", kept, kept)
    assert kept is None or type(answer.input_tokens) is int


@pytest.mark.parametrize(
    "body",
    [
        '{"id": "a", "n": 12345678901234567890123, "x": 1.5}',  # an integer past 64 bits, exactly
        '{"id": "a", "text": "lone \\ud800 surrogate"}',
        '{"id": "a", "text": "caf\\u00e9 \\u0000 nul", "deep": {"list": [1, 2.25, null, true]}}',
    ],
)
def test_a_result_lines_body_is_kept_as_the_same_json(body: str) -> None:
    """The body the store writes is the body the provider sent, as JSON: nothing rounded or dropped."""
    line = '{"custom_id": "c", "response": {"status_code": 200, "body": ' + body + '}, "error": null}'
    for given in (line, line.encode()):
        obj, text = json_and_text_at(given, ("response", "body"))
        assert text is not None
        assert json.loads(text) == json.loads(body) == obj["response"]["body"]
        assert obj["custom_id"] == "c"
