"""Benchmark: every page of `ledger web` on a ledger of 1,000,000 requests and their attempts.

Builds the ledger fast with bench-only bulk SQL (requests by multi-row inserts, attempts by one
INSERT ... SELECT from them), then asks each page through the ASGI app (Starlette's TestClient:
the server's own time, no network) and prints p50 / p95 per page. The target: p95 <= 300 ms.

    python -m bench.web_1m --db sqlite|postgres [--requests 1000000] [--runs 20]
    python -m bench.web_1m --db sqlite --keep /tmp/web1m.db      # build once, keep the file
    python -m bench.web_1m --url sqlite:////tmp/web1m.db          # measure an existing ledger
    python -m bench.web_1m --db postgres --keep web1m              # a kept schema "web1m"
    python -m bench.web_1m --url URL --only overview --repeat 5    # five timed runs of the overview
    python -m bench.web_1m --db postgres --keep raw --after-build none   # never vacuumed nor analysed

--after-build says what the build does last: `vacuum` (VACUUM ANALYZE on PostgreSQL, ANALYZE on
SQLite: statistics and, on PostgreSQL, the visibility map), `analyze` (statistics only: a ledger
whose rows were written since its last vacuum) or `none` (a ledger just loaded, before
autovacuum's first visit, or on a server that has it off).

The shape: 20 jobs of 50,000 requests (two of them running, the rest completed) plus the example
evaluation job with its 30 opinions; three models in two providers; 10 % of the requests in 100
provider batches; 1 % queued, 0.2 % running, 2 % errors, 0.5 % canceled; every twentieth request
answered on its second attempt after a 429; created over the last 7 days.
--pg defaults to $LEDGER_TEST_POSTGRES_URL, else postgresql://postgres@127.0.0.1:5432/test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import insert, select, text, update

from bench.common import PG_DSN, fresh_database
from ledger.models import Job, LlmBatch, LlmPool, LlmRequest, LlmWorker, Opinion
from ledger.pools import endpoint_for
from ledger.settings import load_settings
from ledger.store import Store

JOBS = 20
MODELS = (("openai", "gpt-4o-mini"), ("openai", "gpt-4o"), ("anthropic", "claude-3-5-haiku-latest"))
BATCHES = 100
CHUNK = 5_000
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "eval" / "spec.toml"

requests_t = LlmRequest.__table__  # type: ignore[attr-defined]


def status_of(i: int, n: int) -> str:
    if i >= n - n // 100:
        return "queued"
    if i >= n - n // 100 - n // 500:
        return "running"
    if i % 50 == 7:
        return "error"
    if i % 200 == 13:
        return "canceled"
    return "completed"


def request_rows(n: int, start: datetime) -> Iterator[dict[str, Any]]:
    span = timedelta(days=7) / n
    per_job = n // JOBS
    batched = n // 10
    for i in range(n):
        provider, model = MODELS[i % 3]
        status = status_of(i, n)
        created = start + span * i
        final = status in ("completed", "error", "canceled")
        done = status == "completed"
        yield {
            "idempotency_key": f"bench-{i}",
            "job_id": f"bench-job-{min(i // per_job, JOBS - 1):02d}",
            "fair_seq": i % per_job + 1,
            "provider": provider,
            "model": model,
            "endpoint": endpoint_for(provider, model),
            "input": {"system": "You are a strict grader.", "messages": [{"role": "user", "content": f"Item {i}."}]},
            "params": {"max_tokens": 256},
            "delivery": "batch" if i < batched else "online",
            "batch_id": 1 + i * BATCHES // batched if i < batched else None,
            "status": status,
            "attempts": (2 if i % 20 == 0 else 1) if status != "queued" else 0,
            "next_attempt_at": created,
            "raw_output": f"Item {i} is fine on the whole.\nVERDICT: {1 + i % 5}" if done else None,
            "verdict_text": f"VERDICT: {1 + i % 5}" if done else None,
            "parse_error": "no VERDICT line" if done and i % 100 == 11 else None,
            "finish_reason": ("length" if i % 40 == 3 else "stop") if done else None,
            "error_code": "server_error" if status == "error" else None,
            "last_status_code": 503 if status == "error" else (200 if done else None),
            "input_tokens": 120 + i % 50 if done else None,
            "output_tokens": 40 + i % 30 if done else None,
            "cost_usd": 0.00002 * (1 + i % 7) if done else None,
            "latency_ms": 300 + i % 900 if final else None,
            "trace": {"agent": f"agent-{i % 3}", "dimension": f"dim-{i % 10}"},
            "api": "chat",
            "created_at": created,
            "updated_at": created + timedelta(seconds=2),
            "completed_at": created + timedelta(seconds=2) if final else None,
        }


def build(url: str, n: int, after: str = "vacuum") -> None:
    """The ledger: schema, jobs, batches, requests, attempts, pools, the example job and its opinions."""
    from ledger.jobs import trigger
    from ledger.spec import load_spec

    t0 = time.perf_counter()
    store = Store(url)
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=url)
    example = trigger(store, settings, load_spec(EXAMPLE)).job_id
    now = datetime.now(UTC)
    start = now - timedelta(days=7)
    with store.engine.begin() as conn:
        conn.execute(
            insert(Job.__table__),  # type: ignore[attr-defined]
            [
                {
                    "id": f"bench-job-{j:02d}",
                    "kind": "adhoc",
                    "status": "running" if j >= JOBS - 2 else "completed",
                    "phase": "running" if j >= JOBS - 2 else "completed",
                    "created_at": start + timedelta(days=7) * j / JOBS,
                    "updated_at": start + timedelta(days=7) * (j + 1) / JOBS,
                    "started_at": start + timedelta(days=7) * j / JOBS,
                }
                for j in range(JOBS)
            ],
        )
        conn.execute(
            insert(LlmBatch.__table__),  # type: ignore[attr-defined]
            [
                {
                    "provider": "openai",
                    "model": "gpt-4o-mini",
                    "job_id": "bench-job-00",
                    "status": "completed",
                    "provider_status": "completed",
                    "provider_batch_id": f"batch_bench_{b}",
                    "request_total": n // 10 // BATCHES,
                    "created_at": start + timedelta(minutes=b),
                    "updated_at": start + timedelta(minutes=b),
                }
                for b in range(BATCHES)
            ],
        )
    chunk: list[dict[str, Any]] = []
    for row in request_rows(n, start):
        chunk.append(row)
        if len(chunk) == CHUNK:
            with store.engine.begin() as conn:
                conn.execute(insert(requests_t), chunk)
            chunk = []
    if chunk:
        with store.engine.begin() as conn:
            conn.execute(insert(requests_t), chunk)
    t1 = time.perf_counter()
    print(f"  {n:,} requests in {t1 - t0:.0f}s", flush=True)
    with store.engine.begin() as conn:
        # Every request past the queue has an attempt; every twentieth a 429 before it.
        conn.execute(
            text(
                "INSERT INTO llm_attempts (request_id, attempt, worker, outcome, status_code, error_code, latency_ms,"
                " started_at, finished_at) SELECT id, 1, 'bench-worker', CASE WHEN id % 20 = 0 THEN 'failed'"
                " WHEN status = 'completed' THEN 'succeeded' WHEN status = 'running' THEN 'running' ELSE 'failed' END,"
                " CASE WHEN id % 20 = 0 THEN 429 ELSE last_status_code END,"
                " CASE WHEN id % 20 = 0 THEN 'rate_limited' ELSE error_code END, latency_ms, created_at, completed_at"
                " FROM llm_requests WHERE status <> 'queued' AND job_id <> :example"
            ),
            {"example": example},
        )
        conn.execute(
            text(
                "INSERT INTO llm_attempts (request_id, attempt, worker, outcome, status_code, latency_ms, started_at,"
                " finished_at) SELECT id, 2, 'bench-worker', 'succeeded', 200, latency_ms, created_at, completed_at"
                " FROM llm_requests WHERE id % 20 = 0 AND status = 'completed' AND job_id <> :example"
            ),
            {"example": example},
        )
        pool_rows = [
            {"endpoint": endpoint_for(p, m), "learned_limit": 8 if k == 0 else None} for k, (p, m) in enumerate(MODELS)
        ]
        conn.execute(insert(LlmPool.__table__), pool_rows)  # type: ignore[attr-defined]
        conn.execute(insert(LlmWorker.__table__), [{"worker_id": "bench-worker"}])  # type: ignore[attr-defined]
        # The example job: its 30 requests answered, its 30 opinions written.
        ids = conn.execute(select(requests_t.c.id, requests_t.c.trace).where(requests_t.c.job_id == example)).all()
        for k, (rid, trace) in enumerate(ids):
            score = 1 + k % 5
            conn.execute(
                update(requests_t)
                .where(requests_t.c.id == rid)
                .values(status="completed", raw_output=f"Fine.\nVERDICT: {score}", verdict_text=f"VERDICT: {score}")
                .values(attempts=1, completed_at=now, cost_usd=0.0001, input_tokens=300, output_tokens=60)
            )
            conn.execute(
                insert(Opinion.__table__).values(  # type: ignore[attr-defined]
                    job_id=example, agent=trace["agent"], dimension=trace["dimension"], score=score, request_id=rid
                )
            )
        conn.execute(
            update(Job.__table__)  # type: ignore[attr-defined]
            .where(Job.__table__.c.id == example)  # type: ignore[attr-defined]
            .values(status="completed", phase="completed")
        )
    if after == "vacuum" and store.dialect.name == "postgresql":
        with store.engine.connect() as conn:  # VACUUM runs outside a transaction: on the driver's own
            driver = conn.connection.driver_connection
            assert isinstance(driver, psycopg.Connection)
            driver.autocommit = True
            driver.execute("VACUUM ANALYZE")
    elif after != "none":
        with store.engine.begin() as conn:
            conn.execute(text("ANALYZE"))
    print(f"  attempts, opinions, statistics in {time.perf_counter() - t1:.0f}s", flush=True)
    store.close()


def pages(store: Store) -> list[tuple[str, str]]:
    """(label, path) of every page and fragment, with filters that exercise each index path."""
    top = int(store.request_page(_no_filter(), limit=1).rows[0]["id"])
    middle = top // 2
    return [
        ("overview", "/"),
        ("overview fragment", "/?fragment=overview"),
        ("jobs", "/jobs"),
        ("job (50k requests, running)", "/jobs/bench-job-19"),
        ("job (50k, completed)", "/jobs/bench-job-03"),
        ("job (example, matrix)", "/jobs/example-eval"),
        ("matrix fragment", "/jobs/example-eval?fragment=job_matrix"),
        ("matrix cell", "/jobs/example-eval/cell?agent=prosecutor&dimension=correctness"),
        ("compare", "/jobs/example-eval/compare/example-eval"),
        ("requests", "/requests"),
        ("requests, page in the middle", f"/requests?before={middle}"),
        ("requests ?status=error", "/requests?status=error"),
        ("requests ?status=queued", "/requests?status=queued"),
        ("requests ?model", "/requests?model=gpt-4o"),
        ("requests ?provider&delivery", "/requests?provider=openai&delivery=batch"),
        ("requests ?finish_reason=length", "/requests?finish_reason=length"),
        ("requests ?parse_error", "/requests?parse_error=1"),
        ("requests ?had_429", "/requests?had_429=1"),
        ("requests ?job", "/requests?job=bench-job-07"),
        ("requests ?job&status", "/requests?job=bench-job-07&status=error"),
        ("requests ?pool", "/requests?pool=anthropic:claude-3-5-haiku-latest"),
        ("requests ?q (custom_id)", "/requests?q=bench-99999"),
        ("requests ?batch", "/requests?batch=7"),
        ("request", f"/requests/{middle}"),
        ("attempts fragment", f"/requests/{middle - middle % 20}?fragment=attempts"),
        ("batches", "/batches"),
        ("spend (hour)", "/spend"),
        ("spend (day)", "/spend?unit=day"),
    ]


def _no_filter() -> Any:
    from ledger.store.browse import RequestFilter

    return RequestFilter()


def measure(url: str, runs: int, only: str = "", repeat: int = 1) -> list[tuple[str, float, float]]:
    """Each page's p50 and p95 over `runs` timed requests (pages whose label starts with `only`),
    `repeat` times over, each time reported; the worst of the repeats is returned per page."""
    from starlette.testclient import TestClient

    from ledger.web import WebConfig, create_app

    store = Store(url)
    settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=url)
    app = create_app(store, settings, WebConfig(hosts=frozenset({"testserver"})))
    found = []
    with TestClient(app) as client:
        # At start the ended hours are not summed yet (a background thread sums each once): the
        # first view of /spend shows what is ready, and takes what any view takes.
        t = time.perf_counter()
        assert client.get("/spend?unit=day").status_code == 200
        print(f"  {'spend (day), first view at start':<34} {(time.perf_counter() - t) * 1000:7.1f} ms", flush=True)
        # Then wait for that thread to finish before timing anything: on 2 cores its queries
        # would otherwise be timed as part of every page measured meanwhile.
        filled = time.perf_counter()
        while app.state.web.spend.view("day")["missing"] and time.perf_counter() - filled < 600:
            time.sleep(0.5)
        print(f"  (the ended hours of 30 days summed in the background in {time.perf_counter() - filled:.0f}s)")
        chosen = [(label, path) for label, path in pages(store) if label.startswith(only)]
        for k in range(repeat):
            if repeat > 1:
                print(f"  run {k + 1} of {repeat}", flush=True)
            for label, path in chosen:
                p50, p95 = time_page(client, path, runs)
                found.append((label, p50, p95))
                print(f"  {label:<34} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms", flush=True)
    store.close()
    return found


def time_page(client: Any, path: str, runs: int) -> tuple[float, float]:
    """p50 and p95 of `runs` requests for `path`, after two warm-ups (the first reads its pages
    into the cache)."""
    times = []
    for i in range(runs + 2):
        t = time.perf_counter()
        response = client.get(path)
        elapsed = (time.perf_counter() - t) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{path}: {response.status_code}")
        if i >= 2:
            times.append(elapsed)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pg", default=PG_DSN)
    parser.add_argument("--url", help="Measure this existing ledger (no build).")
    parser.add_argument(
        "--keep", help="Build into this SQLite file (or, with --db postgres, this new schema) and keep it; then --url."
    )
    parser.add_argument("--after-build", choices=("vacuum", "analyze", "none"), default="vacuum")
    parser.add_argument("--only", default="", help="Time only the pages whose label starts with this.")
    parser.add_argument("--repeat", type=int, default=1, help="Time the pages this many times, each reported.")
    args = parser.parse_args()
    if args.url:
        results = measure(args.url, args.runs, args.only, args.repeat)
    else:
        with contextlib.ExitStack() as stack:
            if args.keep and args.db == "postgres":  # a schema of that name, created, kept
                with psycopg.connect(args.pg.replace("+psycopg", ""), autocommit=True) as admin:
                    admin.execute(f'CREATE SCHEMA "{args.keep}"')
                base = args.pg.replace("postgresql://", "postgresql+psycopg://")
                url = f"{base}?options=-csearch_path%3D{args.keep}"
            elif args.keep:
                url = f"sqlite:///{Path(args.keep).resolve()}"
            else:
                url = stack.enter_context(fresh_database("sqlite" if args.db == "sqlite" else "postgres", args.pg))
            print(f"building {args.requests:,} requests ({args.db})", flush=True)
            build(url, args.requests, args.after_build)
            results = measure(url, args.runs, args.only, args.repeat)
    worst = max(p95 for _, _, p95 in results)
    print(f"worst p95: {worst:.1f} ms ({'held' if worst <= 300 else 'MISSED'}: target 300 ms)")


if __name__ == "__main__":
    main()
