"""The mock provider answers the structured batching contract fully, or spoiled on request."""

from __future__ import annotations

import json
from typing import Any

from adapters.mock_provider.answers import chat_answer, mock_verdict
from ledger.parsing import STRUCTURED_ARRAY_KEY, evaluation_schema, parse_verdict

IDS = ["clarity", "evidence", "structure", "originality"]


def structured(content: str, ids: list[str] = IDS) -> list[dict[str, Any]]:
    answer = chat_answer("m", "sys", [{"role": "user", "content": content}], evaluation_schema(ids))
    items: list[dict[str, Any]] = json.loads(answer.text)[STRUCTURED_ARRAY_KEY]
    return items


def test_one_item_per_enum_value_in_enum_order_deterministically() -> None:
    items = structured("agent A")
    assert [i["criterion_id"] for i in items] == IDS
    assert all(type(i["score"]) is int and 1 <= i["score"] <= 5 for i in items)
    assert all(isinstance(i["argument"], str) and isinstance(i["cited_evidence"], list) for i in items)
    assert items == structured("agent A")
    scores = {tuple(i["score"] for i in structured(f"agent {n}")) for n in range(10)}
    assert len(scores) > 3  # the scores vary with the prompt


def test_omit_drops_the_last_items_and_corrupt_spoils_the_first() -> None:
    assert [i["criterion_id"] for i in structured("[[mock:omit=2]]")] == IDS[:2]
    corrupt = structured("[[mock:corrupt=1]]")
    assert [i["score"] for i in corrupt[:1]] == ["excellent"]
    assert all(type(i["score"]) is int for i in corrupt[1:]) and len(corrupt) == len(IDS)
    both = structured("[[mock:omit=1]] [[mock:corrupt=2]]")
    assert [i["criterion_id"] for i in both] == IDS[:3] and [i["score"] for i in both[:2]] == ["excellent"] * 2
    assert len(structured("[[mock:omit=99]]")) == 0 and len(structured("[[mock:omit=bad]]")) == len(IDS)


def test_directives_leave_plain_prompts_alone() -> None:
    for n in range(20):
        messages = [{"role": "user", "content": f"essay {n} [[mock:omit=2]] [[mock:corrupt=1]]"}]
        text = chat_answer("m", "sys", messages, None).text
        assert text.splitlines()[-1] == f"VERDICT: {mock_verdict('m', 'sys', messages)}"
        assert parse_verdict(text).score == mock_verdict("m", "sys", messages)


def test_enum_arrays_whose_item_count_cannot_cover_the_enum_keep_the_old_shape() -> None:
    item = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}}}
    schema = {"type": "object", "properties": {"xs": {"type": "array", "minItems": 3, "items": item}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    value = json.loads(chat_answer("m", None, [{"role": "user", "content": "q"}], fmt).text)
    assert len(value["xs"]) == 3
