"""A three-stage pipeline on the ledger: evidence -> rubric (+ critic) -> score.

    python examples/pipeline/run.py

Each stage enqueues its requests, awaits their answers, and hands them to the next stage; no stage
calls a model. Every request's key is derived from its inputs (`evidence:{claim}`, `rubric:{claim}`,
...), so running the whole pipeline again after a crash enqueues only what is missing and waits
only for what is not final: the rerun *is* the resume. The scoring stage asks for a final
`VERDICT: <1-5>` line and has the ledger parse it (`parse="verdict"`); each request names the
requests it was built from (`sources`), so a score can be walked back to its evidence.

Keyless: with no `OPENAI_BASE_URL` set, the ledger's mock provider runs in this process. With a
`ledger daemon` alive on the database, it does the work; with none, one runs here (`Ledger.working`).
The ledger is `LEDGER_DATABASE_URL` (default: `pipeline.db` in the current directory).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import anyio

from ledger import Ledger
from ledger.settings import load_settings

JOB = "pipeline-demo"
MODEL = "gpt-4o-mini"
CLAIMS = {
    "c1": "The retry policy never calls a provider more than RETRY_MAX_ATTEMPTS times for one request.",
    "c2": "A crash between the claim and the call loses no request.",
    "c3": "Two daemons on one PostgreSQL never exceed the global limit together.",
    "c4": "Provider batch results are mapped back to the right request after a restart.",
}


def ask(key: str, purpose: str, prompt: str, *, sources: list[int] | None = None, **more: Any) -> dict[str, Any]:
    """One request of a stage: its key names what it was built from, so a rerun finds it again."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "idempotency_key": key,
        "job_id": JOB,
        "purpose": purpose,
        "sources": sources,
        "trace": {"stage": purpose},
        **more,
    }


async def stage(ledger: Ledger, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Enqueue a stage's requests (what is already there is skipped) and await every answer."""
    ids = [await ledger.aenqueue(request) for request in requests]
    async with ledger.working():
        rows = await ledger.await_results(ids)
    failed = [r for r in rows if r["status"] != "completed"]
    if failed:
        raise SystemExit(f"{len(failed)} request(s) of the {requests[0]['purpose']} stage failed; see ledger requests")
    return rows


async def pipeline(ledger: Ledger) -> None:
    evidence = await stage(
        ledger,
        [
            ask(f"evidence:{claim}", "evidence", f"List the evidence for and against this claim: {text}")
            for claim, text in CLAIMS.items()
        ],
    )
    by_claim = dict(zip(CLAIMS, evidence, strict=True))
    rubrics = await stage(
        ledger,
        [
            ask(
                f"rubric:{claim}",
                "rubric",
                f"Write a grading rubric for the claim '{CLAIMS[claim]}' given this evidence:\n{row['raw_output']}",
                sources=[row["id"]],
            )
            for claim, row in by_claim.items()
        ],
    )
    critiques = await stage(
        ledger,
        [
            ask(
                f"critic:{claim}",
                "critic",
                f"Critique this rubric and say what it misses:\n{row['raw_output']}",
                sources=[row["id"]],
            )
            for claim, row in zip(CLAIMS, rubrics, strict=True)
        ],
    )
    scores = await stage(
        ledger,
        [
            ask(
                f"score:{claim}",
                "score",
                f"Score the claim '{CLAIMS[claim]}' against the rubric and its critique. "
                f"Reason first, then end with a final line 'VERDICT: <1-5>'.\nRubric:\n{rubric['raw_output']}\n"
                f"Critique:\n{critique['raw_output']}",
                sources=[rubric["id"], critique["id"]],
                parse="verdict",
            )
            for claim, rubric, critique in zip(CLAIMS, rubrics, critiques, strict=True)
        ],
    )
    print(f"{'claim':<6} {'score':<6} request  parse error")
    for claim, row in zip(CLAIMS, scores, strict=True):
        score = "-" if row["parsed_verdict"] is None else str(row["parsed_verdict"])
        print(f"{claim:<6} {score:<6} {row['id']:<8} {row['parse_error'] or ''}")
    first = scores[0]
    print(f"\nlineage of request {first['id']} (score:{next(iter(CLAIMS))}):")
    for source in ledger.lineage(first["id"]):
        print(f"  {'  ' * (source['depth'] - 1)}<- request {source['id']} {source['purpose']} ({source['status']})")


@contextlib.contextmanager
def provider() -> Iterator[dict[str, str]]:
    """The provider to call: the one OPENAI_BASE_URL names, or the mock provider, run here."""
    if os.environ.get("OPENAI_BASE_URL"):
        yield {}
        return
    from adapters.mock_provider import running_mock_provider

    with running_mock_provider(latency=0.05) as mock:
        yield {"OPENAI_BASE_URL": mock.openai_base_url, "OPENAI_API_KEY": "not-needed"}


def main() -> None:
    with provider() as env:
        url = os.environ.get("LEDGER_DATABASE_URL", "sqlite:///pipeline.db")
        settings = load_settings(LEDGER_DATABASE_URL=url, **env)
        with Ledger(settings=settings) as ledger:
            anyio.run(pipeline, ledger)


if __name__ == "__main__":
    main()
