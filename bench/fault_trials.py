"""Fault trials: kill -9 a daemon at a random moment, restart, and count what broke.

Not a timed test: a script to run many trials and read the totals. One trial:

1. a fresh database (SQLite file or PostgreSQL schema), `--requests` requests enqueued;
2. the mock provider in its own process; `python -m ledger.cli daemon` as a real process
   (MAX_CONCURRENT_LLM_CALLS, provider latency and `--worker-id` reuse drawn per trial);
3. the kill moment, drawn from a seeded RNG: during start-up (a random delay after the
   process starts), mid-run (once the provider has seen a random number of calls, plus a
   fraction of a call), in the final drain (the last few calls), or after the last call;
4. the provider's in-flight count read, the daemon SIGKILLed at once; then, once the
   provider has seen every dead connection close, its per-prompt call counts and the
   database (which requests were `completed` at the kill) are snapshotted;
5. a fresh daemon `--until-idle` (same worker id or a new one, by the draw) to the end.

Then the checks, per trial:

- lost: requests not `completed` at the end;
- duplicates: requests with more than one `succeeded` attempt, idempotency keys on more
  than one row (impossible by constraint; counted anyway), rows beyond those enqueued;
- repeated provider calls (prompts the provider saw more than once) against the calls in
  flight at the kill. "In flight" has two readings: the provider's (`in_flight` read just
  before the kill: connections not yet answered) and the ledger's (prompts the provider
  had seen by the kill whose request was not `completed` in the database: the call was
  made but its outcome was not durable; it includes calls answered but not yet recorded).
  A violation is a repeat the ledger's reading does not allow: a prompt called again
  although its answer was recorded before the kill, a prompt called more than twice, a
  prompt the killed daemon itself called twice, or more repeats than calls unrecorded at
  the kill. Repeats beyond the provider's own in-flight count are shown (`>mock`) but
  are not a violation: they are calls the provider had answered and the daemon had not
  yet recorded when it died, which no ledger can avoid repeating.
- also: attempts still `running` after the drain, a restarted daemon that does not exit
  0, a killed daemon that had died before the kill.

    python -m bench.fault_trials [--trials 30] [--db sqlite,postgres] [--seed 1] [--requests 60]
    python -m bench.fault_trials --db postgres --trial-seed 1017   # one trial again

Exit status 1 if any trial found a violation.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import text
from sqlalchemy.engine import Engine

from adapters.mock_provider import MockProviderProcess, mock_provider_process
from adapters.mock_provider.answers import prompt_key
from bench.common import fresh_database, specs
from ledger.api import Ledger
from ledger.settings import load_settings
from ledger.store.schema import make_engine

LEDGER = [sys.executable, "-m", "ledger.cli"]
LEASE_SECONDS = 2.0
MOMENTS = ("startup", "mid", "drain", "after")
MOMENT_WEIGHTS = (0.12, 0.66, 0.14, 0.08)
T = TypeVar("T")


def wait_for(predicate: Callable[[], T | None], timeout: float, interval: float = 0.005) -> T | None:
    """Poll `predicate()` until it returns something truthy, or None at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


@dataclass
class Plan:
    """What one trial does, all drawn from its seed."""

    seed: int
    moment: str
    limit: int
    latency: float
    same_worker: bool
    target_calls: int = 0  # mid / drain: kill once the provider has seen this many calls
    extra_delay: float = 0.0  # then this much longer (a fraction of a call; start-up: the whole delay)

    @classmethod
    def draw(cls, seed: int, requests: int) -> Plan:
        rng = random.Random(seed)
        moment = rng.choices(MOMENTS, MOMENT_WEIGHTS)[0]
        limit = rng.choice((1, 3, 5, 10))
        latency = rng.choice((0.02, 0.05, 0.1))
        plan = cls(seed, moment, limit, latency, same_worker=rng.random() < 0.5)
        if moment == "startup":
            plan.extra_delay = rng.uniform(0.0, 1.5)
        elif moment == "mid":
            plan.target_calls = rng.randint(1, max(1, requests - limit - 1))
            plan.extra_delay = rng.uniform(0.0, latency)
        elif moment == "drain":
            plan.target_calls = rng.randint(max(1, requests - limit), requests)
            plan.extra_delay = rng.uniform(0.0, 2 * latency)
        else:
            plan.extra_delay = rng.uniform(0.0, 0.2)
        return plan

    def describe(self) -> str:
        what = {
            "startup": f"startup+{self.extra_delay:.2f}s",
            "mid": f"mid@{self.target_calls}+{self.extra_delay * 1000:.0f}ms",
            "drain": f"drain@{self.target_calls}+{self.extra_delay * 1000:.0f}ms",
            "after": f"after+{self.extra_delay * 1000:.0f}ms",
        }[self.moment]
        return f"{what:<18} limit={self.limit:<2} lat={self.latency:<4} {'same-id' if self.same_worker else 'new-id '}"


@dataclass
class Result:
    plan: Plan
    calls_at_kill: int = 0  # provider calls seen when the kill was sent
    mock_in_flight: int = 0  # provider's in-flight count read just before the kill
    unrecorded_at_kill: int = 0  # prompts called by the kill whose request was not completed
    completed_at_kill: int = 0
    lost: int = 0
    duplicates: int = 0
    repeated: int = 0  # sum over prompts of (calls - 1)
    total_calls: int = 0
    seconds: float = 0.0
    restart_seconds: float = 0.0  # the restarted daemon, start to exit
    violations: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)


def daemon_env(url: str, mock: MockProviderProcess, limit: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "OPENAI_", "ANTHROPIC_"))}
    env.update(
        LEDGER_DATABASE_URL=url,
        OPENAI_BASE_URL=mock.openai_base_url,
        OPENAI_API_KEY="bench",
        MAX_CONCURRENT_LLM_CALLS=str(limit),
        LEDGER_LEASE_SECONDS=str(LEASE_SECONDS),
        LEDGER_POLL_INTERVAL="0.05",
    )
    return env


def start_daemon(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen([*LEDGER, "daemon", *args], env=env, stdout=sink, stderr=sink)


def db_rows(engine: Engine, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def run_trial(kind: str, plan: Plan, requests: int, keep: Path | None) -> Result:
    result = Result(plan)
    t0 = time.monotonic()
    key_of_request = {str(s.idempotency_key): prompt_key(None, list(s.messages)) for s in specs(requests)}
    with (
        fresh_database(kind) as url,
        mock_provider_process("--latency", str(plan.latency)) as mock,
        tempfile.TemporaryDirectory() as tmp,
        httpx.Client(base_url=mock.base_url, timeout=10) as http,
    ):
        settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=url)
        with Ledger(settings=settings) as ledger:  # also creates the schema: the daemon does not race it
            ledger.enqueue_many(specs(requests))

        def stats() -> dict[str, Any]:
            return dict(http.get("/_stats").json())

        env = daemon_env(url, mock, plan.limit)
        log = Path(tmp) / "daemon.log"
        worker = f"fault-{plan.seed}"
        victim = start_daemon(env, log, "--worker-id", worker)
        started = time.monotonic()

        # -- the kill moment --------------------------------------------------------------
        if plan.moment == "startup":
            wait_for(lambda: time.monotonic() - started >= plan.extra_delay or victim.poll() is not None, 5)
        else:
            target = requests if plan.moment == "after" else plan.target_calls

            def reached() -> bool:
                if victim.poll() is not None:
                    return True
                s = stats()
                return bool(s["calls"] >= target and (plan.moment != "after" or s["in_flight"] == 0))

            if wait_for(reached, 60) is None:
                result.violations.append(f"provider never saw {target} calls within 60 s")
            until = time.monotonic() + plan.extra_delay
            wait_for(lambda: time.monotonic() >= until, plan.extra_delay + 1)
        before = stats()
        alive = victim.poll() is None
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        if not alive:
            result.violations.append(f"the daemon had exited ({victim.returncode}) before the kill")
        result.mock_in_flight = int(before["in_flight"])

        # -- what the kill left behind ----------------------------------------------------
        # Every dead connection closed: the provider has counted every call the daemon made.
        if wait_for(lambda: stats()["in_flight"] == 0, 30) is None:
            result.violations.append("provider still had calls in flight 30 s after the kill")
        at_kill = stats()
        seen_at_kill: dict[str, int] = dict(at_kill["per_prompt"])
        result.calls_at_kill = int(at_kill["calls"])
        engine, _ = make_engine(url)
        try:
            completed_keys = {
                r["idempotency_key"]
                for r in db_rows(engine, "SELECT idempotency_key FROM llm_requests WHERE status = 'completed'")
            }
            result.completed_at_kill = len(completed_keys)
            recorded_prompts = {key_of_request[k] for k in completed_keys if k in key_of_request}
            unrecorded = {p for p in seen_at_kill if p not in recorded_prompts}
            result.unrecorded_at_kill = len(unrecorded)

            # -- the restart, to the end ----------------------------------------------------
            restart = start_daemon(
                env, log, "--until-idle", "--worker-id", worker if plan.same_worker else worker + "-b"
            )
            t_restart = time.monotonic()
            try:
                code = restart.wait(timeout=120)
            except subprocess.TimeoutExpired:
                restart.kill()
                restart.wait()
                code = -1
            if code != 0:
                result.violations.append(f"restarted daemon exited {code}")
            result.restart_seconds = time.monotonic() - t_restart
            final = stats()
            result.seconds = time.monotonic() - t0
            check(result, engine, key_of_request, seen_at_kill, recorded_prompts, unrecorded, final, requests)
        finally:
            engine.dispose()
        if result.violations and keep is not None:
            target_dir = keep / f"{kind}-{plan.seed}"
            target_dir.mkdir(parents=True, exist_ok=True)
            (target_dir / "daemon.log").write_bytes(log.read_bytes())
            result.evidence.append(f"daemon logs kept in {target_dir}")
    return result


def check(
    result: Result,
    engine: Engine,
    key_of_request: dict[str, str],
    seen_at_kill: dict[str, int],
    recorded_prompts: set[str],
    unrecorded: set[str],
    final: dict[str, Any],
    requests: int,
) -> None:
    v = result.violations
    rows = db_rows(engine, "SELECT id, idempotency_key, status, attempts FROM llm_requests ORDER BY id")
    lost_rows = [r for r in rows if r["status"] != "completed"]
    result.lost = len(lost_rows)
    if lost_rows:
        v.append(f"{len(lost_rows)} request(s) not completed")
        result.evidence += [f"not completed: {r}" for r in lost_rows]

    twice = db_rows(
        engine,
        "SELECT request_id, COUNT(*) AS n FROM llm_attempts WHERE outcome = 'succeeded'"
        " GROUP BY request_id HAVING COUNT(*) > 1",
    )
    same_key = db_rows(
        engine, "SELECT idempotency_key, COUNT(*) AS n FROM llm_requests GROUP BY idempotency_key HAVING COUNT(*) > 1"
    )
    extra_rows = max(0, len(rows) - requests)
    result.duplicates = len(twice) + len(same_key) + extra_rows
    if twice:
        v.append(f"{len(twice)} request(s) with more than one succeeded attempt")
        for r in twice:
            result.evidence += [
                f"attempt: {a}"
                for a in db_rows(
                    engine, "SELECT * FROM llm_attempts WHERE request_id = :r ORDER BY attempt", r=r["request_id"]
                )
            ]
    if same_key:
        v.append(f"{len(same_key)} idempotency key(s) on more than one row")
        result.evidence += [f"same key: {r}" for r in same_key]
    if extra_rows:
        v.append(f"{len(rows)} rows for {requests} requests enqueued")

    dangling = db_rows(engine, "SELECT * FROM llm_attempts WHERE outcome = 'running'")
    if dangling:
        v.append(f"{len(dangling)} attempt(s) still running after the drain")
        result.evidence += [f"running attempt: {a}" for a in dangling]

    per_prompt: Counter[str] = Counter(final["per_prompt"])
    result.total_calls = int(final["calls"])
    known = set(key_of_request.values())
    unknown = set(per_prompt) - known
    if unknown:
        v.append(f"provider saw {len(unknown)} prompt(s) never enqueued")
    repeats = {p: n for p, n in per_prompt.items() if n > 1}
    result.repeated = sum(n - 1 for n in repeats.values())
    request_of_key = {p: k for k, p in key_of_request.items()}
    for p, n in sorted(repeats.items()):
        where = f"{request_of_key.get(p, p)} called {n}x ({seen_at_kill.get(p, 0)} before the kill)"
        if n > 2:
            v.append(f"{where}: more than twice with one kill")
        if p in recorded_prompts:
            v.append(f"{where}: called again although its answer was recorded before the kill")
        elif p not in unrecorded:
            v.append(f"{where}: repeated, but not in flight at the kill")
        if seen_at_kill.get(p, 0) > 1:
            v.append(f"{where}: the killed daemon itself called it twice")
    if result.repeated > result.unrecorded_at_kill:
        v.append(f"{result.repeated} repeated calls > {result.unrecorded_at_kill} calls unrecorded at the kill")
    completed_ids = {r["idempotency_key"] for r in rows if r["status"] == "completed"}
    uncalled = [k for k in completed_ids if per_prompt.get(key_of_request.get(k, ""), 0) == 0]
    if uncalled:
        v.append(f"{len(uncalled)} request(s) completed without any provider call")
    if result.violations and repeats:
        for p in sorted(repeats):
            k = request_of_key.get(p)
            result.evidence += [
                f"row {k}: {r}"
                for r in db_rows(
                    engine,
                    "SELECT a.* FROM llm_attempts a JOIN llm_requests q ON q.id = a.request_id"
                    " WHERE q.idempotency_key = :k ORDER BY a.attempt",
                    k=k,
                )
            ]


def line(kind: str, i: int, r: Result) -> str:
    over_mock = r.repeated > r.mock_in_flight
    return (
        f"{kind:<8} #{i:<3} seed={r.plan.seed:<6} {r.plan.describe()} "
        f"| calls@kill={r.calls_at_kill:<3} in-flight@kill mock={r.mock_in_flight:<2} "
        f"unrecorded={r.unrecorded_at_kill:<2} "
        f"| lost={r.lost} dup={r.duplicates} repeated={r.repeated}{' >mock' if over_mock else ''} "
        f"calls={r.total_calls:<3} {r.seconds:4.1f}s (restart {r.restart_seconds:4.1f}s) "
        f"{'VIOLATION' if r.violations else 'ok'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=30, help="trials per database")
    parser.add_argument("--db", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--seed", type=int, default=1, help="trial i runs with seed SEED*1000+i")
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--trial-seed", type=int, default=None, help="run only the trial with this seed")
    parser.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "fault_trials")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.db.split(",") if k.strip()]
    for kind in kinds:
        if kind not in ("sqlite", "postgres"):
            parser.error(f"--db: unknown database {kind!r}")
    seeds = [args.trial_seed] if args.trial_seed is not None else [args.seed * 1000 + i for i in range(args.trials)]
    print(f"fault trials: {len(seeds)} per database on {', '.join(kinds)}, {args.requests} requests each")
    totals: list[str] = []
    failed = False
    for kind in kinds:
        results: list[Result] = []
        for i, seed in enumerate(seeds):
            r = run_trial(kind, Plan.draw(seed, args.requests), args.requests, args.keep)
            results.append(r)
            print(line(kind, i, r), flush=True)
            for problem in r.violations:
                print(f"    violation: {problem}", flush=True)
            for item in r.evidence:
                print(f"    {item}", flush=True)
        moments = Counter(r.plan.moment for r in results)
        bad = sum(1 for r in results if r.violations)
        failed = failed or bad > 0
        totals.append(
            f"{kind:<8} trials={len(results)} ({', '.join(f'{m} {moments[m]}' for m in MOMENTS)}) "
            f"violations={bad} lost={sum(r.lost for r in results)} dup={sum(r.duplicates for r in results)} "
            f"repeated={sum(r.repeated for r in results)} vs in flight at the kill: "
            f"mock={sum(r.mock_in_flight for r in results)} unrecorded={sum(r.unrecorded_at_kill for r in results)} "
            f"(trials with repeats > mock in-flight: {sum(1 for r in results if r.repeated > r.mock_in_flight)}) "
            f"calls={sum(r.total_calls for r in results)} for {len(results) * args.requests} requests"
        )
    print("totals:")
    for t in totals:
        print("  " + t)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
