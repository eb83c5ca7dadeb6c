"""The mock provider through the real SDKs: batches, concurrency cap, stats, CLI errors."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import anthropic
import openai
import pytest

from adapters.mock_provider import RunningMockProvider, parse_fault_rates, running_mock_provider


@pytest.fixture
def mock() -> Iterator[RunningMockProvider]:
    with running_mock_provider(batch_latency=0.2) as server:
        yield server


def poll(fetch, done, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, "batch did not finish in time"
        time.sleep(0.05)


def test_openai_batch_round_trip(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"item {i}"}]},
        }
        for i in range(3)
    ]
    lines.append(
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x [[mock:fail=400x*]]"}]},
        }
    )
    upload = client.files.create(
        file=("in.jsonl", io.BytesIO("\n".join(map(json.dumps, lines)).encode())), purpose="batch"
    )
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    assert done.request_counts is not None and (done.request_counts.total, done.request_counts.failed) == (4, 1)
    assert done.output_file_id and done.error_file_id
    out = {r["custom_id"]: r for r in map(json.loads, client.files.content(done.output_file_id).text.splitlines())}
    assert set(out) == {"c0", "c1", "c2"}
    assert out["c1"]["response"]["body"]["choices"][0]["message"]["content"].splitlines()[-1].startswith("VERDICT")
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["bad"]


def test_anthropic_message_batch_round_trip(mock: RunningMockProvider) -> None:
    client = anthropic.Anthropic(api_key="k", base_url=mock.anthropic_base_url, max_retries=0)
    requests = [
        {
            "custom_id": f"a{i}",
            "params": {"model": "claude", "max_tokens": 100, "messages": [{"role": "user", "content": f"item {i}"}]},
        }
        for i in range(3)
    ]
    batch = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    ended = poll(lambda: client.messages.batches.retrieve(batch.id), lambda b: b.processing_status == "ended")
    assert ended.request_counts.succeeded == 3
    assert ended.results_url and ended.results_url.startswith(mock.base_url)
    results = {r.custom_id: r for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"a0", "a1", "a2"}
    assert results["a0"].result.type == "succeeded"


def test_concurrency_cap_answers_429_and_never_serves_more() -> None:
    with running_mock_provider(latency=0.3, max_concurrency=2) as mock:

        async def burst() -> list[int]:
            client = openai.AsyncOpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)

            async def one(i: int) -> int:
                try:
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": str(i)}])
                    return 200
                except openai.RateLimitError as exc:
                    assert float(exc.response.headers["retry-after"]) > 0
                    return 429

            codes = await asyncio.gather(*(one(i) for i in range(6)))
            await client.close()
            return list(codes)

        codes = asyncio.run(burst())
        stats = mock.stats()
    assert codes.count(200) == 2 and codes.count(429) == 4
    assert stats["max_in_flight"] == 2 and stats["status_counts"] == {"200": 2, "429": 4}


def test_stats_count_per_prompt_and_reset(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "z [[mock:fail=503x2]]"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "z [[mock:fail=503x2]]"}])
    stats = mock.stats()
    assert list(stats["per_prompt"].values()) == [3] and stats["status_counts"] == {"503": 2, "200": 1}
    mock.reset()
    assert mock.stats()["calls"] == 0


def test_bad_fault_rate_is_one_line_and_exit_2() -> None:
    with pytest.raises(ValueError, match=r"--fault-rate 'teapot=0\.1'"):
        parse_fault_rates(["teapot=0.1"])
    result = subprocess.run(
        [sys.executable, "-m", "ledger.cli", "mock-provider", "--fault-rate", "503=lots"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "'503=lots'" in result.stderr and "Traceback" not in result.stderr


def test_a_held_call_is_answered_only_once_released(mock: RunningMockProvider) -> None:
    client = openai.OpenAI(api_key="k", base_url=mock.openai_base_url, max_retries=0)
    answers: list[str] = []

    def call() -> None:
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "wait [[mock:hold]]"}])
        answers.append(reply.choices[0].message.content or "")

    caller = threading.Thread(target=call)
    caller.start()
    poll(mock.stats, lambda s: s["in_flight"] == 1)
    caller.join(timeout=0.3)
    assert caller.is_alive() and answers == []  # still held
    mock.release()
    caller.join(timeout=10)
    assert len(answers) == 1 and "VERDICT:" in answers[0]
