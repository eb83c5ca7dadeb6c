"""Benchmark: 100,000 provider-batch requests through the mock provider, end to end.

Enqueues N `delivery=batch` requests, runs `ledger daemon --until-idle` as a child
process against the mock provider (in its own process), and reads the daemon's
`batch_submitted` / `batch_mapped` events: time to build and upload the input
files, time to map the results back (requests/s), and the daemon's peak RSS
(from wait4, so it is the daemon's alone). Targets: >= 20,000 requests/s mapped,
peak RSS < 300 MB. Usage:

    python -m bench.batch_100k [--requests 100000] [--provider openai|anthropic|gemini] [--db sqlite|postgres]
        [--keep-response full|derived]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.mock_provider import mock_provider_process
from bench.common import fresh_database
from ledger.api import Ledger
from ledger.enqueue import build_spec
from ledger.settings import load_settings

MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}


def enqueue(url: str, n: int, provider: str) -> float:
    t0 = time.monotonic()
    with Ledger(settings=load_settings(LEDGER_DATABASE_URL=url)) as ledger:
        ledger.enqueue_many(
            build_spec(
                provider=provider,
                model=MODELS[provider],
                delivery="batch",
                idempotency_key=f"bench-{i}",
                messages=[
                    {"role": "system", "content": "You are a strict grader. Reason, then end with VERDICT: n."},
                    {"role": "user", "content": f"Grade essay number {i} on clarity. " + "lorem ipsum " * 20},
                ],
                params={"max_tokens": 256},
                trace={"agent": f"agent-{i % 3}", "dimension": f"dim-{i % 10}"},
            )
            for i in range(n)
        )
    return time.monotonic() - t0


def run(n: int, provider: str, db: str, keep_response: str = "full") -> dict[str, Any]:
    with (
        fresh_database(db) as url,
        mock_provider_process("--batch-latency", "1") as mock,
        tempfile.TemporaryDirectory() as tmp,
    ):
        enqueue_s = enqueue(url, n, provider)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "OPENAI_", "ANTHROPIC_"))}
        env |= {
            "LEDGER_DATABASE_URL": url,
            "OPENAI_BASE_URL": mock.openai_base_url,
            "ANTHROPIC_BASE_URL": mock.anthropic_base_url,
            "OPENAI_API_KEY": "bench",
            "ANTHROPIC_API_KEY": "bench",
            "GOOGLE_GEMINI_BASE_URL": mock.base_url,
            "GEMINI_API_KEY": "bench",
            "LEDGER_PROVIDER_BATCH_SIZE": "50000",
            "LEDGER_PROVIDER_BATCH_WAIT": "0",
            "LEDGER_BATCH_POLL_INTERVAL": "0.5",
            "LEDGER_KEEP_RESPONSE": keep_response,
        }
        log = Path(tmp) / "daemon.log"
        t0 = time.monotonic()
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ledger.cli", "daemon", "--until-idle"], env=env, stdout=sink, stderr=sink
            )
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
        events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        submitted = [e for e in events if e["event"] == "batch_submitted"]
        mapped = [e for e in events if e["event"] == "batch_mapped"]
        build_s = sum(e["build_s"] for e in submitted)
        submit_s = sum(e["submit_s"] for e in submitted)
        map_s = sum(e["map_s"] for e in mapped)
        kinds = ("completed", "failed", "retried", "requeued", "canceled", "unchanged")
        lines = sum(e[kind] for e in mapped for kind in kinds)
        return {
            "db": db,
            "provider": provider,
            "requests": n,
            "batches": len(submitted),
            "enqueue_s": round(enqueue_s, 2),
            "build_s": round(build_s, 2),
            "upload_and_create_s": round(submit_s, 2),
            "build_and_upload_req_per_s": round(n / (build_s + submit_s)),
            "map_s": round(map_s, 2),
            "mapped_req_per_s": round(lines / map_s) if map_s else None,
            "completed": sum(e["completed"] for e in mapped),
            "daemon_wall_s": round(wall, 1),
            "daemon_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--provider", choices=sorted(MODELS), default="openai")
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--keep-response", choices=["full", "derived"], default="full", help="LEDGER_KEEP_RESPONSE of the daemon"
    )
    args = parser.parse_args()
    print(
        json.dumps(
            {"keep_response": args.keep_response, **run(args.requests, args.provider, args.db, args.keep_response)}
        )
    )


if __name__ == "__main__":
    main()
