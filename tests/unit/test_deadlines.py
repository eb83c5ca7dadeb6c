"""Delivery `auto`'s deadline: what a user may write (a duration or an ISO-8601 time), where (a line,
a flag, a Python call, a job spec), and the path an `auto` request starts on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ledger.deadlines import parse_deadline
from ledger.enqueue import Defaults, EnqueueError, build_spec, read_jsonl, to_row
from ledger.spec import SpecError, spec_from_mapping
from ledger.statuses import DeliveryChoice

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
LINE = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "given,expected",
    [
        ("90s", NOW + timedelta(seconds=90)),
        ("45m", NOW + timedelta(minutes=45)),
        ("6h", NOW + timedelta(hours=6)),
        ("2d", NOW + timedelta(days=2)),
        ("2026-11-29T08:30:00+01:00", datetime(2026, 11, 29, 7, 30, tzinfo=UTC)),
        ("2026-11-29T08:30:00", datetime(2026, 11, 29, 8, 30, tzinfo=UTC)),  # no zone: UTC
    ],
)
def test_a_deadline_is_a_duration_from_now_or_an_iso_time(given: str, expected: datetime) -> None:
    assert parse_deadline(given, NOW) == expected


@pytest.mark.parametrize("given", ["soon", "5 minutes", "-5m", "5w", ""])
def test_anything_else_is_refused_naming_what_was_given(given: str) -> None:
    with pytest.raises(ValueError, match=r"deadline must be a duration \(90s, 45m, 6h, 2d\) or an ISO-8601 time"):
        parse_deadline(given, NOW)


def test_auto_starts_in_a_batch_where_the_provider_has_a_batch_api_and_online_where_not() -> None:
    batched = to_row(build_spec(**LINE, delivery="auto", deadline="2h"))
    assert batched["delivery"] == "batch" and batched["deadline"] > datetime.now(UTC) + timedelta(minutes=119)
    online = to_row(build_spec(**LINE, provider="openai-compatible", delivery="auto"))
    assert online["delivery"] == "online"
    assert abs(online["deadline"] - datetime.now(UTC) - timedelta(hours=24)) < timedelta(minutes=1)
    assert to_row(build_spec(**LINE, delivery="batch"))["deadline"] is None


def test_the_deadline_is_not_part_of_what_a_request_asks() -> None:
    """The same request with another deadline is the same request (its key and hashes alike)."""
    first = to_row(build_spec(**LINE, delivery="auto", deadline="1h"))
    second = to_row(build_spec(**LINE, delivery="auto", deadline="3h"))
    for key in ("idempotency_key", "body_hash", "cache_key"):
        assert first[key] == second[key]


def test_a_lines_deadline_asks_for_auto_and_the_flags_override_it() -> None:
    ((_, spec),) = read_jsonl([json.dumps({**LINE, "deadline": "90s"})], Defaults())
    assert spec.delivery == DeliveryChoice.AUTO and spec.deadline is not None
    flag = NOW + timedelta(hours=5)
    ((_, spec),) = read_jsonl(
        [json.dumps({**LINE, "deadline": "90s"})], Defaults(delivery=DeliveryChoice.AUTO, deadline=flag)
    )
    assert spec.deadline == flag
    with pytest.raises(EnqueueError, match="deadline: only with delivery 'auto', not 'batch'"):
        list(read_jsonl([json.dumps({**LINE, "deadline": "90s"})], Defaults(delivery=DeliveryChoice.BATCH)))


def test_a_job_specs_deadline_is_fixed_when_read_and_only_with_auto() -> None:
    base = {
        "artifact": {"text": "x"},
        "agents": [{"name": "a", "provider": "openai", "model": "gpt-4o-mini", "system": "s"}],
        "dimensions": [{"id": "d", "name": "D", "instruction": "judge it"}],
    }
    spec = spec_from_mapping(
        {**base, "delivery": "auto", "deadline": "6h"}, source="s", base_dir=Path(), default_id="j"
    )
    fixed = datetime.fromisoformat(spec.deadline or "")
    assert abs(fixed - datetime.now(UTC) - timedelta(hours=6)) < timedelta(minutes=1)
    with pytest.raises(SpecError, match=r"^s: deadline: only with delivery 'auto', not 'batch'$"):
        spec_from_mapping({**base, "delivery": "batch", "deadline": "6h"}, source="s", base_dir=Path(), default_id="j")


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--delivery", "auto", "--deadline", "soon"], "--deadline must be a duration (90s, 45m, 6h, 2d)"),
        (["--deadline", "6h"], "--deadline: only with --delivery auto"),
    ],
)
def test_a_bad_deadline_flag_is_one_line_and_exit_2(tmp_path: Path, flags: list[str], message: str) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(LINE) + "\n")
    env = {**os.environ, "LEDGER_DATABASE_URL": f"sqlite:///{tmp_path}/l.db"}
    done = subprocess.run(
        [sys.executable, "-m", "ledger.cli", "enqueue", str(path), *flags], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "l.db").exists()  # nothing written
