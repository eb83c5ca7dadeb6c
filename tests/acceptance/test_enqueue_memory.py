"""A 100k-line enqueue streams: the process's peak memory does not grow with the file.

Not a timing test: it compares peak RSS of two real `ledger enqueue` processes,
one on a file 100x smaller. Speed is reported by bench/enqueue_100k.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def write_file(path: Path, lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            f.write(
                json.dumps(
                    {
                        "custom_id": f"m-{i}",
                        "body": {
                            "model": "m",
                            "messages": [{"role": "user", "content": f"request {i} " + "padding " * 40}],
                        },
                    }
                )
                + "\n"
            )


def peak_rss_mib(path: Path, url: str) -> float:
    child = subprocess.Popen(
        [sys.executable, "-m", "ledger.cli", "enqueue", str(path), "--provider", "mock"],
        env={**os.environ, "LEDGER_DATABASE_URL": url, "LEDGER_LOG_LEVEL": "WARNING"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, child.stderr.read() if child.stderr else ""
    return usage.ru_maxrss / 1024


def test_100k_lines_need_no_more_memory_than_1k(tmp_path: Path) -> None:
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    write_file(small, 1_000)
    write_file(big, 100_000)
    small_peak = peak_rss_mib(small, f"sqlite:///{tmp_path}/small.db")
    big_peak = peak_rss_mib(big, f"sqlite:///{tmp_path}/big.db")
    # 100k rows held in memory would be hundreds of MiB; streaming stays within noise.
    assert big_peak - small_peak < 40, (small_peak, big_peak)
    out = subprocess.run(
        [sys.executable, "-m", "ledger.cli", "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "LEDGER_DATABASE_URL": f"sqlite:///{tmp_path}/big.db"},
        check=True,
    )
    assert "queued 100000" in out.stdout
