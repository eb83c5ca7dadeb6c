"""Parsing derived fields: the VERDICT forms of docs/parsing.md and the structured batching contract."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.mock_provider.answers import chat_answer
from ledger.parsing import (
    RAW_LIMIT,
    STRUCTURED_ARRAY_KEY,
    evaluation_schema,
    parse_structured,
    parse_verdict,
)

REASONING = "The essay argues clearly.\nThe evidence is thin in places."

# One row per line of the "accepted forms" table in docs/parsing.md.
ACCEPTED = [
    ("VERDICT: 4", 4),
    ("verdict: 4", 4),
    ("VERDICT:4", 4),
    ("**VERDICT:** 4", 4),
    ("**VERDICT: 4**", 4),
    ("*Verdict*: 4", 4),
    ("__VERDICT__: 4", 4),
    ("VERDICT: **4**", 4),
    ("- VERDICT: 4", 4),
    ("* VERDICT: 4", 4),
    ("1. VERDICT: 4", 4),
    ("> VERDICT: 4", 4),
    ("### VERDICT: 4", 4),
    ("`VERDICT: 4`", 4),
    ("VERDICT: `4`", 4),
    ("VERDICT: [4]", 4),
    ("VERDICT: (4)", 4),
    ("VERDICT: 4.", 4),
    ("VERDICT: 4.0", 4),
    ("VERDICT: 4 — solid but thin", 4),
    ("VERDICT: 4 (strong)", 4),
    ("Final verdict: 4", 4),
    ("VERDICT: 4/5", 4),
    ("VERDICT: [4/5]", 4),
    ("VERDICT: 4 out of 5", 4),
    ("VERDICT: 0/5", 1),
    ("VERDICT: 7/10", 4),
    ("VERDICT: 5/10", 3),
    ("VERDICT: 10/10", 5),
    ("VERDICT: 0/10", 1),
    ("VERDICT: 1/10", 1),
    ("VERDICT: 3/4", 4),
    ("VERDICT: 72/100", 4),
]

# Input → a fragment of the error it must give.
REJECTED = [
    ("VERDICT: 6", "outside 1..5"),
    ("VERDICT: 0", "outside 1..5"),
    ("VERDICT: -1", "outside 1..5"),
    ("VERDICT: 3.5", "non-integer"),
    ("VERDICT: 3.5/5", "non-integer"),
    ("VERDICT: 3-4", "ambiguous"),
    ("VERDICT: 3 \u2013 4", "ambiguous"),
    ("VERDICT: 3 or 4", "ambiguous"),
    ("VERDICT: 3 to 4", "ambiguous"),
    ("VERDICT: 3, 4", "ambiguous"),
    ("VERDICT: 3/5 or 4/5", "ambiguous"),
    ("VERDICT: good", "no number"),
    ("VERDICT: N/A", "no number"),
    ("VERDICT:", "no number"),
    ("VERDICT: 4/0", "zero denominator"),
    ("VERDICT: 4/", "no denominator"),
    ("VERDICT: 12/10", "outside 0..10"),
]


@pytest.mark.parametrize(("line", "score"), ACCEPTED, ids=[line for line, _ in ACCEPTED])
def test_accepted_form(line: str, score: int) -> None:
    verdict = parse_verdict(f"{REASONING}\n{line}\n")
    assert (verdict.score, verdict.error) == (score, None)
    assert verdict.verdict_text == line
    assert verdict.reasoning == REASONING


@pytest.mark.parametrize(("line", "why"), REJECTED, ids=[line for line, _ in REJECTED])
def test_rejected_form(line: str, why: str) -> None:
    verdict = parse_verdict(f"{REASONING}\n{line}")
    assert verdict.score is None
    assert verdict.error is not None and why in verdict.error and "\n" not in verdict.error
    assert verdict.verdict_text == line and verdict.reasoning == REASONING


@pytest.mark.parametrize(
    ("raw", "why"), [(None, "empty"), ("", "empty"), ("  \n ", "empty"), (REASONING, "no VERDICT")]
)
def test_no_verdict_line(raw: str | None, why: str) -> None:
    verdict = parse_verdict(raw)
    assert verdict.score is None and verdict.verdict_text is None and verdict.reasoning is None
    assert verdict.error is not None and why in verdict.error


def test_the_last_verdict_line_wins() -> None:
    assert parse_verdict("VERDICT: 2\nOn reflection, more.\nVERDICT: 5").score == 5
    later_unparseable = parse_verdict("VERDICT: 2\nOn reflection:\nVERDICT: 3 or 4")
    assert later_unparseable.score is None and later_unparseable.error is not None
    assert later_unparseable.reasoning == "VERDICT: 2\nOn reflection:"


def test_a_lone_verdict_line_has_no_reasoning_and_other_scales_rescale() -> None:
    assert parse_verdict("VERDICT: 3") == parse_verdict("  VERDICT: 3  ")
    assert parse_verdict("VERDICT: 3").reasoning is None
    assert parse_verdict("VERDICT: 7/10", low=1, high=10).score == 7
    assert parse_verdict("VERDICT: 8", low=1, high=10).score == 8


# -- structured batching ------------------------------------------------------

IDS = [f"dim_{i}" for i in range(10)]


def entry(dimension: str, score: Any = 3, **extra: Any) -> dict[str, Any]:
    return {
        "criterion_id": dimension,
        "score": score,
        "argument": f"why {dimension}",
        "cited_evidence": ["p. 2"],
    } | extra


def output(entries: list[Any]) -> str:
    return json.dumps({STRUCTURED_ARRAY_KEY: entries})


def test_schema_asks_for_every_dimension_strictly() -> None:
    fmt = evaluation_schema(IDS[:3])
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    array = schema["properties"][STRUCTURED_ARRAY_KEY]
    item = array["items"]
    assert schema["required"] == [STRUCTURED_ARRAY_KEY] and schema["additionalProperties"] is False
    assert array["minItems"] == array["maxItems"] == 3
    assert item["additionalProperties"] is False and set(item["required"]) == set(item["properties"])
    assert item["properties"]["criterion_id"]["enum"] == IDS[:3]
    assert item["properties"]["score"] == {"type": "integer", "minimum": 1, "maximum": 5}
    with pytest.raises(ValueError):
        evaluation_schema(["a", "a"])


def test_full_answer_is_accepted_in_asked_order() -> None:
    parsed = parse_structured(output([entry(d, i % 5 + 1) for i, d in enumerate(reversed(IDS))]), IDS)
    assert list(parsed.entries) == IDS and parsed.missing == () and parsed.rejected == () and parsed.error is None
    assert parsed.entries["dim_9"].score == 1 and parsed.entries["dim_9"].cited_evidence == ("p. 2",)


def test_eight_of_ten_leaves_two_missing() -> None:
    parsed = parse_structured(output([entry(d) for d in IDS[:8]]), IDS)
    assert len(parsed.entries) == 8 and parsed.missing == ("dim_8", "dim_9") and parsed.rejected == ()


def test_a_corrupt_entry_is_rejected_with_its_raw_json_and_retried() -> None:
    parsed = parse_structured(output([entry(IDS[0], "excellent")] + [entry(d) for d in IDS[1:]]), IDS)
    assert parsed.missing == ("dim_0",) and len(parsed.entries) == 9
    (rejected,) = parsed.rejected
    assert json.loads(rejected.raw) == entry(IDS[0], "excellent") and "score" in rejected.reason


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (entry("dim_0", True), "score"),
        (entry("dim_0", 4.0), "score"),
        (entry("dim_0", 6), "score"),
        (entry("dim_0", argument=None), "argument"),
        (entry("dim_0", cited_evidence="p. 2"), "cited_evidence"),
        (entry("dim_0", cited_evidence=[1]), "cited_evidence"),
        ({"score": 3}, "criterion_id"),
        ("dim_0: 3", "not an object"),
    ],
    ids=["bool", "float", "out-of-range", "argument", "evidence-str", "evidence-int", "no-id", "string"],
)
def test_schema_violations_are_rejected(bad: Any, why: str) -> None:
    parsed = parse_structured(output([bad, entry("dim_1")]), IDS[:2])
    assert list(parsed.entries) == ["dim_1"] and parsed.missing == ("dim_0",)
    assert len(parsed.rejected) == 1 and why in parsed.rejected[0].reason


def test_missing_evidence_is_no_evidence_and_extra_keys_are_ignored() -> None:
    bare = {"criterion_id": "dim_0", "score": 2, "argument": "short"}
    parsed = parse_structured(output([bare, entry("dim_1", confidence=0.9)]), IDS[:2])
    assert parsed.entries["dim_0"].cited_evidence == () and list(parsed.entries) == IDS[:2]


def test_unknown_id_is_rejected_but_not_missing() -> None:
    parsed = parse_structured(output([entry(d) for d in IDS] + [entry("dim_99")]), IDS)
    assert parsed.missing == () and len(parsed.entries) == 10
    assert [r.reason for r in parsed.rejected] == ["unknown criterion_id 'dim_99'"]


def test_duplicate_first_valid_wins() -> None:
    entries = [entry("dim_0", "bad"), entry("dim_0", 2), entry("dim_0", 5), entry("dim_1")]
    parsed = parse_structured(output(entries), IDS[:2])
    assert parsed.entries["dim_0"].score == 2 and parsed.missing == ()
    assert ["duplicate" in r.reason for r in parsed.rejected] == [False, True]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"evaluations": [', "not JSON"),
        ("Here are my scores: 4, 3, 5", "not JSON"),
        ("", "empty"),
        (None, "empty"),
        ('{"results": []}', 'no "evaluations" array'),
        ("[1, 2]", 'no "evaluations" array'),
    ],
    ids=["truncated", "prose", "empty", "none", "wrong-key", "bare-array"],
)
def test_unusable_output_leaves_everything_missing(raw: str | None, why: str) -> None:
    parsed = parse_structured(raw, IDS)
    assert parsed.entries == {} and parsed.missing == tuple(IDS)
    assert parsed.error is not None and why in parsed.error
    assert [r.raw for r in parsed.rejected] == [raw or ""]


def test_raw_text_is_truncated() -> None:
    parsed = parse_structured("x" * 10_000, IDS)
    assert RAW_LIMIT <= len(parsed.rejected[0].raw) < RAW_LIMIT + 40


def test_fenced_json_is_accepted() -> None:
    fenced = f"```json\n{output([entry(d) for d in IDS])}\n```"
    assert parse_structured(fenced, IDS).missing == ()
    assert parse_structured(f"```\n{output([entry('dim_0')])}```", IDS[:1]).missing == ()


# -- round trip through the mock provider --------------------------------------


def mock_structured(directive: str = "") -> str:
    messages = [{"role": "user", "content": f"Evaluate agent A on every dimension. {directive}"}]
    return chat_answer("mock-model", "You are a strict grader.", messages, evaluation_schema(IDS)).text


def test_mock_structured_answer_parses_fully() -> None:
    parsed = parse_structured(mock_structured(), IDS)
    assert list(parsed.entries) == IDS and parsed.missing == () and parsed.rejected == ()
    assert all(1 <= e.score <= 5 and e.argument for e in parsed.entries.values())


def test_mock_omit_two_leaves_two_missing() -> None:
    parsed = parse_structured(mock_structured("[[mock:omit=2]]"), IDS)
    assert parsed.missing == tuple(IDS[-2:]) and parsed.rejected == () and len(parsed.entries) == 8


def test_mock_corrupt_one_is_rejected_and_missing() -> None:
    parsed = parse_structured(mock_structured("[[mock:corrupt=1]]"), IDS)
    assert parsed.missing == (IDS[0],) and len(parsed.rejected) == 1 and len(parsed.entries) == 9
    assert json.loads(parsed.rejected[0].raw)["criterion_id"] == IDS[0]
