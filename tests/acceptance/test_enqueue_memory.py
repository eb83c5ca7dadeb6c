"""A 100k-line enqueue streams: the process's peak memory does not grow with the file.

Not a timing test: it compares peak RSS of two real `ledger enqueue` processes,
one on a file 100x smaller, run the way bench/enqueue_100k.py runs them (which
reports the speed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.enqueue_100k import run as enqueue_in_child
from bench.enqueue_100k import write_file


def test_100k_lines_need_no_more_memory_than_1k(tmp_path: Path) -> None:
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    write_file(small, 1_000)
    write_file(big, 100_000)
    _, small_peak = enqueue_in_child(f"sqlite:///{tmp_path}/small.db", small)
    _, big_peak = enqueue_in_child(f"sqlite:///{tmp_path}/big.db", big)
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
