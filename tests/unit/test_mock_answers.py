"""The mock provider's answers: deterministic, VERDICT-terminated, schema-conforming."""

from __future__ import annotations

import json

from adapters.mock_provider.answers import chat_answer, directives, prompt_key

USER = [{"role": "user", "content": "Grade the essay."}]


def test_same_prompt_same_answer_different_prompt_different_answer() -> None:
    first = chat_answer("m", "sys", USER, None)
    assert first == chat_answer("m", "sys", USER, None)
    others = {chat_answer("m", "sys", [{"role": "user", "content": f"essay {i}"}], None).text for i in range(20)}
    assert len(others) > 5


def test_plain_answers_end_with_a_verdict_line() -> None:
    for i in range(30):
        last = chat_answer("m", None, [{"role": "user", "content": f"q{i}"}], None).text.splitlines()[-1]
        assert last.startswith("VERDICT: ") and 1 <= int(last.split(": ")[1]) <= 5


def test_schema_answers_conform() -> None:
    schema = {
        "type": "object",
        "required": ["items"],
        "properties": {
            "items": {
                "type": "array",
                "minItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "criterion_id": {"type": "string"},
                        "score": {"type": "integer", "minimum": 1, "maximum": 5},
                        "kind": {"enum": ["a", "b"]},
                        "ok": {"type": "boolean"},
                    },
                },
            }
        },
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    value = json.loads(chat_answer("m", None, USER, fmt).text)
    assert len(value["items"]) == 3
    for item in value["items"]:
        assert 1 <= item["score"] <= 5 and item["kind"] in ("a", "b") and isinstance(item["ok"], bool)


def test_content_blocks_and_strings_are_the_same_prompt() -> None:
    blocks = [{"role": "user", "content": [{"type": "text", "text": "Grade the essay."}]}]
    assert prompt_key(None, blocks) == prompt_key(None, USER)


def test_directives_are_parsed() -> None:
    assert directives("x [[mock:fail=503x2]] y [[mock:quota]] [[mock:retry_after=0.5]]") == {
        "fail": "503x2",
        "quota": "",
        "retry_after": "0.5",
    }
