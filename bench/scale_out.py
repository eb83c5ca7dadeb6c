"""Benchmark: scale-out. 1, 2 and 4 daemons on one PostgreSQL against the mock provider.

Two scenarios, each run for every daemon count:

(a) latency-bound: 200 ms per call, limit 50, 2,000 requests. The bound is
    limit / latency = 250 requests/s; the fraction reached is the bound time
    (requests x latency / limit) over the measured makespan (first `acquired` to
    last `released` across all daemons' logs). Target: >= 0.95 for every N, and
    the provider never sees more than the limit in flight. Beside each run, against
    the same mock provider: a bare `AsyncOpenAI` + `asyncio.Semaphore(limit)` loop
    over the same number of requests, the fraction of the bound the SDK alone reaches
    on this machine (`bench.sdk_ratio`'s loop).
(b) CPU-bound: 0 ms latency, limit 50: aggregate requests/s, and where the
    ceiling comes from: CPU seconds of the daemon processes (`wait4` rusage), of
    the mock provider (/proc/<pid>/stat before it stops), of the daemons'
    PostgreSQL backends (/proc/<pid>/stat, sampled while they live) and of the
    whole machine (/proc/stat); PostgreSQL commits/s (`pg_stat_database.xact_commit`);
    and how much daemons wait for each other's locks (`pg_stat_activity` sampled every
    ~20 ms: a daemon backend on any heavyweight `Lock`: advisory turns, rows (`tuple`,
    `transactionid`), relations). `--cpu-bound` runs this scenario only, and prints per
    daemon count req/s, the speed-up over the count before it and the lock-wait share
    (of the daemons' statement time, the samples' active backends, spent waiting on a lock).

On a machine with fewer cores than daemons, req/s cannot grow with N; the lock-wait share is the
figure that shows whether daemons still queue behind one another. On a 16-core host:

    python -m bench.scale_out --cpu-bound --daemons 1,2,4,8,16

The requests are enqueued through the Python API first; then the N daemons start
together as real processes (`python -m ledger.cli daemon --until-idle`), each with
its own `application_name`, worker id and JSON log file.

    python -m bench.scale_out [--daemons 1,2,4] [--requests 2000] [--cpu-requests 4000]
                              [--limit 50] [--latency 0.2] [--runs 1]
                              [--scenario latency,cpu] [--cpu-bound] [--pg DSN]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from adapters.mock_provider import mock_provider_process
from bench.common import PG_DSN, fresh_database, machine_busy_s, proc_cpu_s, specs
from bench.sdk_ratio import bare_loop
from ledger.api import Ledger
from ledger.settings import load_settings

APP_PREFIX = "ledger-scale-d"


def wait_gone(dsn: str, prefix: str, timeout: float = 10.0) -> None:
    """Until no backend named `prefix...` is left: a backend flushes its statistics as it exits."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (prefix + "%",)
            ).fetchone()
            if row is None or row[0] == 0:
                return
            time.sleep(0.02)


def xact_commit(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_stat_force_next_flush(), xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[1])


@dataclass
class Sample:
    ts: float
    backends: int  # daemon backends connected
    active: int  # of which running a statement
    on_lock: int  # of which waiting on a lock another session holds (any heavyweight Lock)
    waits: tuple[str, ...]  # the lock types waited on (advisory, tuple, transactionid, ...)
    daemons_cpu: float  # cumulative CPU seconds: the daemon processes
    mock_cpu: float  # the mock provider
    backends_cpu: float  # the daemons' PostgreSQL backends (last seen value of each, ever)
    bench_cpu: float  # this process (the sampler)
    busy: float  # the whole machine, busy and total CPU seconds since boot
    total: float


@dataclass
class Sampler:
    """Every `interval` seconds, on a thread: the daemons' backends in pg_stat_activity, and the
    CPU counters of the daemons, their backends, the mock provider and the machine."""

    dsn: str
    mock_pid: int
    daemon_pids: list[int] = field(default_factory=list)
    interval: float = 0.02
    samples: list[Sample] = field(default_factory=list)
    backend_cpu: dict[int, float] = field(default_factory=dict)
    daemon_cpu: dict[int, float] = field(default_factory=dict)
    queries: int = 0
    others_active: int = 0  # samples in which a client of this database other than ours ran a statement
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        query = (
            "SELECT pid, state, wait_event_type, wait_event, application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        with psycopg.connect(self.dsn, autocommit=True, application_name="bench-scale-sampler") as conn:
            while not self._stop.is_set():
                found = conn.execute(query).fetchall()
                self.queries += 1
                ts = time.time()
                ours = [r for r in found if (r[4] or "").startswith(APP_PREFIX)]
                if len(ours) < len(found) and any(r[1] == "active" for r in found if r not in ours):
                    self.others_active += 1
                for pid, *_ in ours:
                    cpu = proc_cpu_s(pid)
                    if cpu is not None:
                        self.backend_cpu[pid] = cpu
                for pid in list(self.daemon_pids):
                    cpu = proc_cpu_s(pid)
                    if cpu is not None:
                        self.daemon_cpu[pid] = cpu
                own = resource.getrusage(resource.RUSAGE_SELF)
                busy, total = machine_busy_s()
                self.samples.append(
                    Sample(
                        ts=ts,
                        backends=len(ours),
                        active=sum(1 for r in ours if r[1] == "active"),
                        on_lock=sum(1 for r in ours if r[2] == "Lock"),
                        waits=tuple(str(r[3]) for r in ours if r[2] == "Lock"),
                        daemons_cpu=sum(self.daemon_cpu.values()),
                        mock_cpu=proc_cpu_s(self.mock_pid) or 0.0,
                        backends_cpu=sum(self.backend_cpu.values()),
                        bench_cpu=own.ru_utime + own.ru_stime,
                        busy=busy,
                        total=total,
                    )
                )
                self._stop.wait(self.interval)


@dataclass
class Run:
    daemons: int
    requests: int
    makespan: float  # first `acquired` to last `released`, all daemons' logs
    wall: float  # daemons started to all exited
    completed: int
    provider_max_in_flight: int
    log_max_slots: int
    per_daemon: list[int]  # `acquired` events in each daemon's log
    daemon_cpu_life: float  # wait4 rusage of the daemon processes, start-up included
    mock_cpu_life: float  # /proc/<pid>/stat of the mock provider before it stops
    # Cores used over the makespan (CPU-seconds per second, from the samples around it):
    daemons_cores: float
    mock_cores: float
    pg_cores: float
    bench_cores: float
    machine_cores: float  # every process on the machine
    cores: int
    commits: int  # xact_commit delta of the database, the sampler's own transactions removed
    lock_share: float  # share of samples in the makespan with a daemon backend waiting on a lock
    mean_waiters: float
    wait_share: float  # of the daemons' backends running a statement, the share waiting on a lock
    wait_types: dict[str, int]  # lock type -> backend samples waiting on it
    active_share: float  # share of samples with a daemon backend running a statement
    others_share: float  # share of samples where another client of the database ran a statement
    bare_s: float | None = None  # the bare SDK loop's time for the same requests, same mock (latency runs)

    @property
    def other_cores(self) -> float:
        return self.machine_cores - self.daemons_cores - self.mock_cores - self.pg_cores - self.bench_cores


def log_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def max_slots(records: list[dict[str, Any]]) -> int:
    held = peak = 0
    for e in sorted((e for e in records if e["event"] in ("acquired", "released")), key=lambda e: e["ts"]):
        held += 1 if e["event"] == "acquired" else -1
        peak = max(peak, held)
    return peak


def around(samples: list[Sample], first: float, last: float) -> tuple[Sample, Sample]:
    """The last sample at or before `first` and the first at or after `last` (or the ends)."""
    before = [s for s in samples if s.ts <= first]
    after = [s for s in samples if s.ts >= last]
    return (before[-1] if before else samples[0]), (after[0] if after else samples[-1])


def run_once(pg: str, n_daemons: int, n_requests: int, limit: int, latency: float, bare: bool = False) -> Run:
    with (
        fresh_database("postgres", pg) as url,
        mock_provider_process("--latency", str(latency)) as mock,
        tempfile.TemporaryDirectory() as tmp,
    ):
        enqueue_url = f"{url}&application_name=bench-scale-enqueue"
        settings = load_settings(_env_file=None, LEDGER_DATABASE_URL=enqueue_url, MAX_CONCURRENT_LLM_CALLS=limit)
        with Ledger(settings=settings) as ledger:
            ledger.enqueue_many(specs(n_requests))
        wait_gone(pg, "bench-scale-")
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("LEDGER_", "OPENAI_", "ANTHROPIC_"))}
        base_env.update(
            OPENAI_BASE_URL=mock.openai_base_url,
            OPENAI_API_KEY="bench",
            MAX_CONCURRENT_LLM_CALLS=str(limit),
            LEDGER_LOG_LEVEL="INFO",
        )
        logs = [Path(tmp) / f"daemon-{i}.log" for i in range(n_daemons)]
        sampler = Sampler(pg, mock.proc.pid)
        commits_before = xact_commit(pg)
        sampler.start()
        t0 = time.time()
        procs: list[subprocess.Popen[bytes]] = []
        for i, log in enumerate(logs):
            env = dict(base_env, LEDGER_DATABASE_URL=f"{url}&application_name={APP_PREFIX}{i}")
            with log.open("wb") as sink:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "ledger.cli", "daemon", "--until-idle", "--worker-id", f"d{i}"],
                        env=env,
                        stdout=sink,
                        stderr=sink,
                    )
                )
            sampler.daemon_pids.append(procs[-1].pid)
        daemon_cpu = 0.0
        for proc in procs:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            daemon_cpu += usage.ru_utime + usage.ru_stime
        wall = time.time() - t0
        time.sleep(0.1)  # a sample or more after the end
        sampler.stop()
        mock_cpu = proc_cpu_s(mock.proc.pid) or 0.0
        provider = mock.stats()
        bare_s = asyncio.run(bare_loop(mock.openai_base_url, n_requests, limit)) if bare else None
        wait_gone(pg, APP_PREFIX)
        wait_gone(pg, "bench-scale-")
        commits = xact_commit(pg) - commits_before - sampler.queries - 1
        for proc, log in zip(procs, logs, strict=True):
            if proc.returncode != 0:
                raise RuntimeError(f"daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM llm_requests WHERE status = 'completed'").fetchone()
        completed = int(row[0]) if row else 0
        per_log = [log_events(log) for log in logs]
    merged = [e for records in per_log for e in records]
    slots = [e["ts"] for e in merged if e["event"] in ("acquired", "released")]
    first, last = min(slots), max(slots)
    window = [s for s in sampler.samples if first <= s.ts <= last] or sampler.samples
    s0, s1 = around(sampler.samples, first, last)
    span = max(s1.ts - s0.ts, 1e-9)
    return Run(
        daemons=n_daemons,
        requests=n_requests,
        makespan=last - first,
        wall=wall,
        completed=completed,
        provider_max_in_flight=int(provider["max_in_flight"]),
        log_max_slots=max_slots(merged),
        per_daemon=[Counter(e["event"] for e in records)["acquired"] for records in per_log],
        daemon_cpu_life=daemon_cpu,
        mock_cpu_life=mock_cpu,
        daemons_cores=(s1.daemons_cpu - s0.daemons_cpu) / span,
        mock_cores=(s1.mock_cpu - s0.mock_cpu) / span,
        pg_cores=(s1.backends_cpu - s0.backends_cpu) / span,
        bench_cores=(s1.bench_cpu - s0.bench_cpu) / span,
        machine_cores=(s1.busy - s0.busy) / span,
        cores=round((s1.total - s0.total) / span),
        commits=commits,
        lock_share=sum(1 for s in window if s.on_lock > 0) / len(window),
        mean_waiters=sum(s.on_lock for s in window) / len(window),
        wait_share=sum(s.on_lock for s in window) / max(1, sum(s.active for s in window)),
        wait_types=dict(Counter(w for s in window for w in s.waits)),
        active_share=sum(1 for s in window if s.active > 0) / len(window),
        others_share=sampler.others_active / max(1, sampler.queries),
        bare_s=bare_s,
    )


def warn_others(runs: list[Run]) -> None:
    busy = [r for r in runs if r.others_share > 0]
    if busy:
        shares = ", ".join(f"N={r.daemons}: {r.others_share:.0%}" for r in busy)
        print(f"  warning: other clients of this database were running statements in some samples ({shares})")


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def latency_table(runs: list[Run], limit: int, latency: float) -> None:
    bound = limit / latency
    rows = []
    for r in runs:
        ideal = r.requests * latency / limit
        rows.append(
            [
                str(r.daemons),
                f"{r.completed}/{r.requests}",
                f"{r.makespan:.3f}",
                f"{ideal:.3f}",
                f"{r.requests / r.makespan:.1f}",
                f"{ideal / r.makespan:.3f}",
                f"{ideal / r.bare_s:.3f}" if r.bare_s else "-",
                f"{r.bare_s / r.makespan:.3f}" if r.bare_s else "-",
                str(r.provider_max_in_flight),
                str(r.log_max_slots),
                f"{r.machine_cores:.2f}/{r.cores}",
                f"{r.daemons_cores:.2f}",
                f"{r.mock_cores + r.pg_cores + r.bench_cores:.2f}",
                f"{r.other_cores:.2f}",
                f"{r.daemons_cores * r.makespan / r.requests * 1000:.2f}",
                f"{r.lock_share:.0%}",
                f"{r.wall:.2f}",
                "/".join(map(str, r.per_daemon)),
            ]
        )
    header = [
        "N",
        "done",
        "makespan s",
        "bound s",
        "req/s",
        "fraction",
        "bare fraction",
        "vs bare",
        "prov max",
        "log max",
        "busy cores",
        "daemons",
        "mock+pg+bench",
        "other",
        "daemon ms/req",
        "lock-wait",
        "wall s",
        "per daemon",
    ]
    print_table(f"(a) latency-bound: latency {latency}s, limit {limit}, bound {bound:.0f} req/s", header, rows)
    print(
        "  fraction = bound time / makespan; bare fraction: the same for a bare AsyncOpenAI + semaphore loop\n"
        "  against the same mock right after (its time from the first call to the last answer); vs bare =\n"
        "  bare time / makespan; prov max: the provider's max in flight; log max: most slots held at\n"
        "  once replaying all logs; cores over the makespan as in (b); wall: daemons started to all exited."
    )


def cpu_table(runs: list[Run], limit: int) -> None:
    rows = []
    for r in runs:
        per_req = r.makespan / r.requests * 1000  # ms of wall per request: cores x this = CPU ms per request
        rows.append(
            [
                str(r.daemons),
                f"{r.completed}/{r.requests}",
                f"{r.makespan:.2f}",
                f"{r.requests / r.makespan:.0f}",
                f"{r.machine_cores:.2f}/{r.cores}",
                f"{r.daemons_cores:.2f}",
                f"{r.mock_cores:.2f}",
                f"{r.pg_cores:.2f}",
                f"{r.bench_cores:.2f}",
                f"{r.other_cores:.2f}",
                f"{r.daemons_cores * per_req:.2f}",
                f"{r.mock_cores * per_req:.2f}",
                f"{r.pg_cores * per_req:.2f}",
                f"{r.commits / r.makespan:.0f}",
                f"{r.commits / r.requests:.2f}",
                f"{r.lock_share:.0%}",
                f"{r.mean_waiters:.2f}",
                f"{r.active_share:.0%}",
                f"{r.daemon_cpu_life:.1f}",
                f"{r.mock_cpu_life:.1f}",
                str(r.provider_max_in_flight),
                "/".join(map(str, r.per_daemon)),
            ]
        )
    header = [
        "N",
        "done",
        "makespan s",
        "req/s",
        "busy cores",
        "daemons",
        "mock",
        "pg",
        "bench",
        "other",
        "daemon ms/req",
        "mock ms/req",
        "pg ms/req",
        "commits/s",
        "commits/req",
        "lock-wait",
        "waiters",
        "db active",
        "daemon cpu s",
        "mock cpu s",
        "prov max",
        "per daemon",
    ]
    print_table(f"(b) CPU-bound: latency 0, limit {limit}", header, rows)
    print(
        "  Over the makespan: busy cores = CPU-seconds per second of the whole machine / cores; daemons, mock,\n"
        "  pg (the daemons' PostgreSQL backends), bench (this process, the sampler) and other (everything else:\n"
        "  PostgreSQL's walwriter etc., the OS, other users) in cores; ms/req = CPU ms per request.\n"
        "  lock-wait: share of ~20 ms samples with a daemon backend waiting on a lock (any heavyweight Lock);\n"
        "  waiters: mean backends waiting; db active: share with a daemon backend running a statement.\n"
        "  commits: pg_stat_database.xact_commit delta over the makespan. daemon/mock cpu s: whole life\n"
        "  (wait4 rusage; /proc/<pid>/stat), start-up included."
    )


def scale_table(runs: list[Run]) -> None:
    """Per daemon count: req/s (mean of the runs), speed-up over the count before it, and the
    share of the daemons' statement time spent waiting on another daemon's lock."""
    counts = sorted({r.daemons for r in runs})
    rows, before = [], None
    for n in counts:
        mine = [r for r in runs if r.daemons == n]
        rate = sum(r.requests / r.makespan for r in mine) / len(mine)
        types: Counter[str] = Counter()
        for r in mine:
            types.update(r.wait_types)
        rows.append(
            [
                str(n),
                " ".join(f"{r.requests / r.makespan:.0f}" for r in mine),
                f"{rate:.0f}",
                f"{rate / before:.2f}" if before else "-",
                " ".join(f"{r.wait_share:.0%}" for r in mine),
                " ".join(f"{r.lock_share:.0%}" for r in mine),
                ", ".join(f"{t} {c}" for t, c in types.most_common(3)) or "-",
            ]
        )
        before = rate
    header = ["N", "req/s (runs)", "req/s", "x prev N", "lock-wait share", "samples waiting", "waited on"]
    print_table("scale-out, CPU-bound", header, rows)
    print(
        "  lock-wait share: of the daemons' backends running a statement (~20 ms samples), the share waiting\n"
        "  on a lock another session holds; samples waiting: share of samples with any daemon backend waiting.\n"
        "  On a 16-core host the goal is 8 daemons >= 1.6 x 4 daemons; on fewer cores, the wait share must fall."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--daemons", default="1,2,4", help="comma-separated daemon counts")
    parser.add_argument("--requests", type=int, default=2000, help="requests in the latency-bound scenario")
    parser.add_argument("--cpu-requests", type=int, default=4000, help="requests in the CPU-bound scenario")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=1, help="repetitions of each (scenario, N)")
    parser.add_argument("--scenario", default="latency,cpu", help="latency, cpu or both")
    parser.add_argument("--cpu-bound", action="store_true", help="the CPU-bound scenario only, with its scale table")
    parser.add_argument("--pg", default=PG_DSN, help="PostgreSQL DSN (a throw-away schema is created in it)")
    args = parser.parse_args()
    counts = [int(x) for x in args.daemons.split(",")]
    scenarios = ["cpu"] if args.cpu_bound else args.scenario.split(",")
    print(f"{os.cpu_count()} CPUs; daemons {counts}; runs {args.runs}")
    if "latency" in scenarios:
        runs = [
            run_once(args.pg, n, args.requests, args.limit, args.latency, bare=True)
            for _ in range(args.runs)
            for n in counts
        ]
        latency_table(sorted(runs, key=lambda r: r.daemons), args.limit, args.latency)
        warn_others(runs)
    if "cpu" in scenarios:
        runs = [run_once(args.pg, n, args.cpu_requests, args.limit, 0.0) for _ in range(args.runs) for n in counts]
        cpu_table(sorted(runs, key=lambda r: r.daemons), args.limit)
        scale_table(runs)
        warn_others(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
