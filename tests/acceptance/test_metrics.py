"""`ledger daemon --metrics-port`: a real daemon process scraped over HTTP, against the ledger's own numbers."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from ledger.store import Store
from tests.acceptance.procs import (
    LEDGER,
    enqueue,
    events,
    ledger_env,
    mock_provider,
    start_daemon,
    wait_for,
    write_requests,
)

OPERATIONS_DOC = Path(__file__).parents[2] / "docs" / "operations.md"
Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """Every sample of a scrape, by sample name (counters end in `_total`, histograms in `_count`...)."""
    found: Samples = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == want for k, want in labels.items()))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    summed: dict[str, float] = {}
    for found, v in samples.get(name, []):
        summed[found[label]] = summed.get(found[label], 0) + v
    return {k: v for k, v in summed.items() if v}


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (Linux: its socket inodes matched against /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def start_event(log: Path) -> dict[str, object] | None:
    return next((e for e in events(log) if e["event"] == "start"), None) if log.exists() else None


@contextmanager
def running_daemon(env: dict[str, str], log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """A daemon left running (no --until-idle: it must still be there to be scraped), stopped with SIGTERM."""
    proc = start_daemon(env, log, *args)
    try:
        wait_for(lambda: start_event(log) or proc.poll() is not None)
        assert proc.poll() is None, log.read_text()[-2000:]
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def test_metrics_scraped_from_a_running_daemon_show_the_counts_of_a_finished_run(db_url: str, tmp_path: Path) -> None:
    prompts = [("agent", f"plain-{i}", f"plain {i}") for i in range(6)]
    prompts += [("agent", f"rl-{i}", f"rl {i} [[mock:fail=429x1]] [[mock:retry_after=0.05]]") for i in range(3)]
    prompts += [("agent", f"down-{i}", f"down {i} [[mock:fail=500x*]]") for i in range(2)]
    log = tmp_path / "daemon.log"
    with mock_provider() as mock:
        env = ledger_env(
            db_url,
            mock,
            MAX_CONCURRENT_LLM_CALLS=4,
            RETRY_MAX_ATTEMPTS=2,
            RETRY_INITIAL_DELAY=0.05,
            RETRY_MAX_DELAY=0.2,
            LEDGER_METRICS_INTERVAL=0.1,
        )
        enqueue(env, write_requests(tmp_path / "run.jsonl", prompts))
        store = Store(db_url)
        try:
            with running_daemon(env, log, "--metrics-port", "0") as daemon:
                url = str((start_event(log) or {})["metrics"])
                assert listening_ports(daemon.pid) == {int(url.rsplit(":", 1)[1].split("/")[0])}
                wait_for(lambda: store.status_counts()["completed"] + store.status_counts()["error"] == len(prompts))
                with store.engine.connect() as conn:
                    (pool,) = conn.execute(text("SELECT DISTINCT endpoint FROM llm_requests")).scalars()
                    by_code = {
                        str(code): n
                        for code, n in conn.execute(
                            text("SELECT status_code, COUNT(*) FROM llm_attempts GROUP BY status_code")
                        )
                    }
                    tokens_in, tokens_out, cost = conn.execute(
                        text("SELECT SUM(input_tokens), SUM(output_tokens), SUM(cost_usd) FROM llm_requests")
                    ).one()
                    learned = conn.execute(text("SELECT learned_limit FROM llm_pools")).scalar()
                attempts = sum(by_code.values())

                # The counters follow the commits at once, the gauges within a reading: poll, with a deadline.
                def settled() -> Samples | None:
                    found = scrape(url)
                    done = total(found, "ledger_requests", status="completed") + total(
                        found, "ledger_requests", status="error"
                    )
                    return found if total(found, "ledger_attempts_total") == attempts and done == len(prompts) else None

                scraped: Samples = wait_for(settled, timeout=15, interval=0.05)
        finally:
            store.close()

    counts = {"completed": 9, "error": 2}
    assert by_code == {"200": 9, "429": 3, "500": 4}
    assert by_label(scraped, "ledger_requests", "status") == counts
    assert by_label(scraped, "ledger_requests_finished_total", "status") == counts
    assert by_label(scraped, "ledger_attempts_total", "status_code") == by_code
    assert by_label(scraped, "ledger_attempts_total", "outcome") == {"succeeded": 9, "failed": 7}
    assert total(scraped, "ledger_attempts_total", pool=pool) == attempts
    assert total(scraped, "ledger_call_seconds_count", pool=pool) == attempts
    assert total(scraped, "ledger_tokens_total", direction="input") == tokens_in > 0
    assert total(scraped, "ledger_tokens_total", direction="output") == tokens_out > 0
    assert abs(total(scraped, "ledger_cost_usd_total") - (cost or 0.0)) < 1e-9
    assert total(scraped, "ledger_requests_claimed_total") >= len(prompts)
    assert total(scraped, "ledger_pool_in_flight", pool=pool) == 0
    assert total(scraped, "ledger_queue_depth", pool=pool) == 0
    assert total(scraped, "ledger_pool_limit", pool=pool, kind="configured") == 4
    limits = {labels["kind"] for labels, _ in scraped["ledger_pool_limit"]}
    assert limits == ({"configured", "learned"} if learned is not None else {"configured"})
    if learned is not None:  # the 429s taught the pool a limit: served as the ledger holds it
        assert total(scraped, "ledger_pool_limit", pool=pool, kind="learned") == learned
    assert total(scraped, "ledger_global_limit") == 4
    assert total(scraped, "ledger_record_transaction_seconds_count") > 0
    assert total(scraped, "ledger_claim_transaction_seconds_count") > 0
    assert total(scraped, "ledger_lease_renewals_lost_total") == 0
    assert daemon.returncode == 0
    # The metrics tables of docs/operations.md name every metric served, and nothing that is not.
    documented = set(re.findall(r"^\| `(ledger_\w+)`", OPERATIONS_DOC.read_text(), flags=re.M))
    served = {re.sub(r"_(bucket|count|sum)$", "", name) for name in scraped if name.startswith("ledger_")}
    assert {name for name in served if not name.endswith("_created")} == documented


def test_without_a_metrics_port_nothing_listens(sqlite_url: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with running_daemon(ledger_env(sqlite_url), log) as daemon:
        assert (start_event(log) or {})["metrics"] is None
        assert listening_ports(daemon.pid) == set()
    assert daemon.returncode == 0


def test_a_metrics_port_in_use_is_one_line_and_exit_2(sqlite_url: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*LEDGER, "daemon", "--until-idle", "--metrics-port", str(port)],
            env=ledger_env(sqlite_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"LEDGER_METRICS_PORT: cannot serve metrics on 127.0.0.1:{port}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
