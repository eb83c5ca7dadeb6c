"""The pure half of evaluation jobs: which requests a spec makes, and what a job's requests conclude."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.evaluation import FAILED_ARGUMENT, SINGLE, STRUCTURED, plan, requests_for, single_key, structured_key
from ledger.spec import JobSpec, spec_from_mapping


def spec(dims: int = 3, agents: tuple[str, ...] = ("a", "b"), provider: str = "openai") -> JobSpec:
    return spec_from_mapping(
        {
            "id": "j",
            "artifact": {"text": "x = 1"},
            "agents": [
                {"name": name, "provider": provider, "model": "gpt-4o-mini", "system": f"I am {name}."}
                for name in agents
            ],
            "dimensions": [{"id": f"d{i}", "name": f"D{i}", "instruction": f"Rate {i}."} for i in range(dims)],
        },
        source="t",
        base_dir=Path("."),
        default_id="j",
    )


def row(rid: int, status: str, trace: dict[str, Any], raw: str | None = None, attempts: int = 1) -> dict[str, Any]:
    return {"id": rid, "status": status, "trace": trace, "raw_output": raw, "attempts": attempts}


def single(rid: int, agent: str, dim: str, status: str = "completed", raw: str | None = "ok\nVERDICT: 4") -> Any:
    return row(rid, status, {"agent": agent, "dimension": dim, "mode": SINGLE}, raw)


def structured(rid: int, agent: str, entries: list[dict[str, Any]], status: str = "completed") -> Any:
    return row(rid, status, {"agent": agent, "mode": STRUCTURED}, json.dumps({"evaluations": entries}))


def entry(dim: str, score: Any = 3) -> dict[str, Any]:
    return {"criterion_id": dim, "score": score, "argument": f"about {dim}", "cited_evidence": ["x = 1"]}


def test_per_dimension_requests_carry_agent_and_dimension() -> None:
    made = requests_for(spec(), frozenset())
    assert [(r.trace or {})["dimension"] for r in made] == ["d0", "d1", "d2"] * 2
    assert made[0].idempotency_key == single_key("j", "a", "d0") and made[0].system == "I am a."
    assert "VERDICT: <1-5>" in made[0].messages[0]["content"] and made[0].response_format is None


def test_structured_requests_only_for_providers_that_enforce_a_schema() -> None:
    made = requests_for(spec(), frozenset({"openai"}))
    assert [r.idempotency_key for r in made] == [structured_key("j", "a"), structured_key("j", "b")]
    assert made[0].response_format is not None
    fallback = requests_for(spec(provider="openai-compatible"), frozenset({"openai"}))
    assert len(fallback) == 6  # one request per dimension


def test_open_requests_are_pending_not_gaps() -> None:
    found = plan(spec(agents=("a",)), [single(1, "a", "d0", "running"), single(2, "a", "d1"), single(3, "a", "d2")])
    assert found.pending == 1 and not found.gaps and len(found.opinions) == 2 and not found.complete


def test_partial_structured_answer_leaves_gaps_for_what_is_missing_or_rejected() -> None:
    found = plan(spec(agents=("a",)), [structured(1, "a", [entry("d0"), entry("d1", score=9)])])
    assert [(a.name, d.id, s) for a, d, s in found.gaps] == [("a", "d1", 0), ("a", "d2", 0)]
    assert [(o["dimension"], o["score"]) for o in found.opinions] == [("d0", 3)]
    assert len(found.rejected[1]) == 1 and found.derived[1]["parse_error"] == "2 of 3 dimensions missing or rejected"


def test_an_individual_answer_fills_the_gap_and_wins() -> None:
    rows = [structured(1, "a", [entry("d0")]), single(2, "a", "d1"), single(3, "a", "d2", raw="no verdict here")]
    found = plan(spec(agents=("a",)), rows)
    assert found.complete
    by_dim = {o["dimension"]: o for o in found.opinions}
    assert by_dim["d1"]["score"] == 4 and by_dim["d1"]["request_id"] == 2
    assert by_dim["d2"]["score"] is None and by_dim["d2"]["parse_error"]  # flagged, not failed


def test_a_failed_request_becomes_a_failure_opinion_with_its_attempt_count() -> None:
    failed = row(1, "error", {"agent": "a", "dimension": "d0", "mode": SINGLE}, attempts=3)
    failed |= {"last_status_code": 503, "error_message": "boom"}
    found = plan(spec(agents=("a",), dims=1), [failed])
    (opinion,) = found.opinions
    assert opinion["score"] is None and opinion["argument"] == FAILED_ARGUMENT.format(n=3)
    assert "last status 503" in opinion["error_line"]


def test_a_failed_structured_request_turns_every_dimension_into_a_gap() -> None:
    found = plan(spec(agents=("a",)), [structured(1, "a", [], status="error")])
    assert len(found.gaps) == 3 and not found.opinions
