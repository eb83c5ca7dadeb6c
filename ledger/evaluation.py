"""What an evaluation job asks and what it concludes: pure functions, no I/O.

`requests_for` turns a spec into request specs (per dimension, or one structured
request per agent). `plan` reads a job's requests as the ledger
holds them and says, for every (agent, dimension): its opinion if its source is
final, or that it is still pending, or that it is a gap to fill with one
individual request (missing from a structured answer, rejected, or the
structured request failed). The coordinator, `ledger reparse` and tests all use
the same two functions, so a reparse reproduces exactly what the job concluded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger.enqueue import RequestSpec, build_spec
from ledger.parsing import RejectedEntry, cut_off, evaluation_schema, parse_structured, parse_verdict
from ledger.spec import AgentSpec, DimensionSpec, JobSpec
from ledger.statuses import OPEN_STATUSES, DeliveryChoice, RequestStatus

SINGLE, STRUCTURED = "single", "structured"
PURPOSE = "evaluation"
FAILED_ARGUMENT = "Evaluation failed after {n} retries"


def single_key(job_id: str, agent: str, dimension: str) -> str:
    return f"{job_id}:{agent}:{dimension}"


def structured_key(job_id: str, agent: str) -> str:
    return f"{job_id}:{agent}:*"


def sample_key(key: str, sample: int) -> str:
    """A request's key for a sample other than the first (`samples = N` in a spec); the first
    keeps the key a job without samples has."""
    return key if sample == 0 else f"{key}#s{sample}"


def _sampled(trace: dict[str, Any], sample: int) -> dict[str, Any]:
    return {**trace, "sample": sample} if sample else trace


def _criterion(d: DimensionSpec) -> str:
    lines = [f"### {d.name} (`{d.id}`)", d.instruction.strip()]
    if d.success:
        lines.append(f"Success looks like: {d.success.strip()}")
    if d.failure:
        lines.append(f"Failure looks like: {d.failure.strip()}")
    return "\n".join(lines)


def single_prompt(spec: JobSpec, dimension: DimensionSpec) -> str:
    return (
        "Judge the artifact below on one dimension.\n\n"
        f"{_criterion(dimension)}\n\n## Artifact\n{spec.artifact.strip()}\n\n"
        "Score it from 1 (worst) to 5 (best). Reason step by step, citing the artifact, "
        "then end with a final line exactly `VERDICT: <1-5>`."
    )


def structured_prompt(spec: JobSpec) -> str:
    criteria = "\n\n".join(_criterion(d) for d in spec.dimensions)
    return (
        "Judge the artifact below on every dimension listed.\n\n"
        f"## Dimensions\n{criteria}\n\n## Artifact\n{spec.artifact.strip()}\n\n"
        "Answer with JSON: an `evaluations` array holding one entry per dimension, each with "
        "`criterion_id`, `score` (an integer from 1, worst, to 5, best), `argument` and "
        "`cited_evidence` (quotes from the artifact)."
    )


def _request(spec: JobSpec, agent: AgentSpec, **fields: Any) -> RequestSpec:
    return build_spec(
        provider=agent.provider,
        model=agent.model,
        system=agent.system,
        params=dict(agent.params),
        delivery=DeliveryChoice(spec.delivery),
        deadline=spec.deadline,
        job_id=spec.id,
        purpose=PURPOSE,
        cache=spec.cache,
        **fields,
    )


def single_request(spec: JobSpec, agent: AgentSpec, dimension: DimensionSpec, sample: int = 0) -> RequestSpec:
    return _request(
        spec,
        agent,
        idempotency_key=sample_key(single_key(spec.id, agent.name, dimension.id), sample),
        messages=[{"role": "user", "content": single_prompt(spec, dimension)}],
        trace=_sampled({"agent": agent.name, "dimension": dimension.id, "mode": SINGLE}, sample),
        sample=sample,
    )


def requests_for(spec: JobSpec, structured_for: frozenset[str]) -> list[RequestSpec]:
    """The job's first requests: one structured request for agents whose provider is in
    `structured_for` (empty unless BATCHING_ENABLED), one per dimension for the rest;
    all of it once per sample (`samples = N`: samples 0..N-1, each its own answer)."""
    out: list[RequestSpec] = []
    ids = [d.id for d in spec.dimensions]
    for sample in range(spec.samples):
        for agent in spec.agents:
            if agent.provider in structured_for:
                trace = {"agent": agent.name, "dimension": "*", "dimensions": ids, "mode": STRUCTURED}
                out.append(
                    _request(
                        spec,
                        agent,
                        idempotency_key=sample_key(structured_key(spec.id, agent.name), sample),
                        messages=[{"role": "user", "content": structured_prompt(spec)}],
                        response_format=evaluation_schema(ids),
                        trace=_sampled(trace, sample),
                        sample=sample,
                    )
                )
            else:
                out.extend(single_request(spec, agent, d, sample) for d in spec.dimensions)
    return out


@dataclass
class Plan:
    """Where a job stands, derived from its requests alone."""

    derived: dict[int, dict[str, Any]] = field(default_factory=dict)  # request id -> derived fields
    opinions: list[dict[str, Any]] = field(default_factory=list)  # known now, in (sample, agent, dimension) order
    # (agent, dimension, sample) that need an individual request
    gaps: list[tuple[AgentSpec, DimensionSpec, int]] = field(default_factory=list)
    pending: int = 0  # cells whose source is not final yet
    rejected: dict[int, tuple[RejectedEntry, ...]] = field(default_factory=dict)  # structured request -> discarded

    @property
    def complete(self) -> bool:
        return not self.gaps and not self.pending


def plan(spec: JobSpec, rows: list[dict[str, Any]]) -> Plan:
    """Every (agent, dimension) of the job, per sample: its opinion, pending, or a gap."""
    out = Plan()
    single: dict[tuple[str, str, int], dict[str, Any]] = {}
    structured: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        trace = row.get("trace") or {}
        sample = int(trace.get("sample") or 0)
        if trace.get("mode") == STRUCTURED:
            structured[(str(trace.get("agent")), sample)] = row
        elif trace.get("mode") == SINGLE:
            single[(str(trace.get("agent")), str(trace.get("dimension")), sample)] = row
    ids = [d.id for d in spec.dimensions]
    for sample in range(spec.samples):
        for agent in spec.agents:
            whole = structured.get((agent.name, sample))
            entries = _structured_entries(whole, ids, out) if whole is not None else None
            for dimension in spec.dimensions:
                alone = single.get((agent.name, dimension.id, sample))
                if alone is not None:
                    if alone["status"] in OPEN_STATUSES:
                        out.pending += 1
                    else:
                        out.opinions.append(_single_opinion(agent, dimension, alone, out, sample))
                elif whole is not None and whole["status"] in OPEN_STATUSES:
                    out.pending += 1
                elif whole is not None and entries is not None and dimension.id in entries:
                    entry = entries[dimension.id]
                    out.opinions.append(
                        _opinion(
                            agent, dimension, whole, entry.score, entry.argument, list(entry.cited_evidence), sample
                        )
                    )
                else:
                    out.gaps.append((agent, dimension, sample))
    return out


def _structured_entries(row: dict[str, Any], ids: list[str], out: Plan) -> dict[str, Any] | None:
    if row["status"] != RequestStatus.COMPLETED.value:
        return None
    parsed = parse_structured(row.get("raw_output"), ids)
    error = parsed.error or (
        f"{len(parsed.missing)} of {len(ids)} dimensions missing or rejected" if parsed.missing else None
    )
    out.derived[row["id"]] = {
        "reasoning": None,
        "verdict_text": None,
        "parsed_verdict": {
            d: {"score": e.score, "argument": e.argument, "cited_evidence": list(e.cited_evidence)}
            for d, e in parsed.entries.items()
        },
        "parse_error": cut_off(error, row.get("finish_reason"), row.get("params")),
    }
    if parsed.rejected:
        out.rejected[row["id"]] = parsed.rejected
    return dict(parsed.entries)


def _single_opinion(
    agent: AgentSpec, dimension: DimensionSpec, row: dict[str, Any], out: Plan, sample: int
) -> dict[str, Any]:
    if row["status"] != RequestStatus.COMPLETED.value:
        opinion = _opinion(agent, dimension, row, None, FAILED_ARGUMENT.format(n=row["attempts"]), [], sample)
        opinion["error_line"] = failure_line(agent.name, dimension.id, row)
        return opinion
    verdict = parse_verdict(row.get("raw_output"))
    error = cut_off(verdict.error, row.get("finish_reason"), row.get("params"))
    out.derived[row["id"]] = {
        "reasoning": verdict.reasoning,
        "verdict_text": verdict.verdict_text,
        "parsed_verdict": verdict.score,
        "parse_error": error,
    }
    opinion = _opinion(agent, dimension, row, verdict.score, verdict.reasoning, [], sample)
    opinion["parse_error"] = error
    return opinion


def _opinion(
    agent: AgentSpec,
    dimension: DimensionSpec,
    row: dict[str, Any],
    score: int | None,
    argument: str | None,
    cited: Any,
    sample: int,
) -> dict[str, Any]:
    return {
        "agent": agent.name,
        "dimension": dimension.id,
        "sample": sample,
        "score": score,
        "argument": argument,
        "cited_evidence": cited,
        "request_id": row["id"],
        "parse_error": None,
    }


def failure_line(agent: str, dimension: str, row: dict[str, Any]) -> str:
    """The job's error-list entry for a request that ended without an answer."""
    elapsed = elapsed_seconds(row.get("created_at"), row.get("completed_at"))
    return (
        f"{agent}/{dimension}: request {row['id']} ended {row['status']} after {row['attempts']} attempts "
        f"(last status {row.get('last_status_code')}, {elapsed:.1f}s): {row.get('error_message') or row['status']}"
    )


def elapsed_seconds(start: Any, end: Any) -> float:
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return 0.0
    return max((end - start).total_seconds(), 0.0)
