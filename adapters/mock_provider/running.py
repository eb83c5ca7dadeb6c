"""Running the mock provider: in a thread of this process, or as a child process."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from adapters.mock_provider.config import MockProviderConfig
from adapters.mock_provider.server import MockProviderServer


class MockProviderAddress:
    """Where a running mock provider answers, and its control endpoints."""

    base_url: str

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.base_url + "/_stats", timeout=10).json())

    def answered(self, answer_id: str) -> bytes:
        """The body of an answer the mock sent (its `id`), as the bytes it sent."""
        reply = httpx.get(f"{self.base_url}/_answered/{answer_id}", timeout=10)
        reply.raise_for_status()
        return reply.content

    def release(self) -> None:
        """Let every `[[mock:hold]]` call, now and from now on, be answered."""
        httpx.post(self.base_url + "/_release", timeout=10).raise_for_status()

    def reset(self) -> None:
        httpx.post(self.base_url + "/_reset", timeout=10)

    def spend_quota(self, model: str, spent: bool = True) -> None:
        """Every call of `model` refused as by an account with no quota left (False: reset)."""
        httpx.post(self.base_url + "/_quota", json={"model": model, "spent": spent}, timeout=10).raise_for_status()


@dataclass
class RunningMockProvider(MockProviderAddress):
    """A mock provider served from a thread of this process."""

    port: int
    server: MockProviderServer

    @property
    def base_url(self) -> str:  # type: ignore[override]
        return f"http://127.0.0.1:{self.port}"


@dataclass
class MockProviderProcess(MockProviderAddress):
    """A mock provider in a child process (its CPU does not compete with the caller's)."""

    proc: subprocess.Popen[str]
    base_url: str


@contextmanager
def mock_provider_process(
    *args: str, command: Sequence[str] = (sys.executable, "-m", "adapters.mock_provider")
) -> Iterator[MockProviderProcess]:
    """Start `command --port 0 ARGS...`, wait for its `listening on URL` line, SIGTERM it on exit."""
    proc = subprocess.Popen([*command, "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on" not in line:
            failed = proc.stderr.read() if proc.stderr and proc.poll() is not None else ""
            raise RuntimeError(f"mock provider did not start: {line!r} {failed}")
        yield MockProviderProcess(proc, line.strip().rsplit(" ", 1)[-1])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def running_mock_provider(config: MockProviderConfig | None = None, **overrides: Any) -> Iterator[RunningMockProvider]:
    """Run the server in a background thread with its own event loop; stop it on exit."""
    server = MockProviderServer(config or MockProviderConfig(**overrides))
    with anyio.from_thread.start_blocking_portal() as portal:
        serving, port = portal.start_task(server.serve)
        try:
            yield RunningMockProvider(port, server)
        finally:
            serving.cancel()
