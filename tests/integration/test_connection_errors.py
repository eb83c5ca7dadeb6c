"""A call to a server that is not listening (or a host that does not resolve) says where it went
and why, through each real SDK, and never the key it carried."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest

from adapters.anthropic import AnthropicAdapter
from adapters.base import CallRequest
from adapters.errors import ProviderError
from adapters.gemini import GeminiAdapter
from adapters.openai import OpenAIAdapter

KEY = "sk-secret-never-stored"


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def failure(adapter: Any) -> ProviderError:
    async def go() -> None:
        try:
            await adapter.call(
                CallRequest(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]), timeout=5
            )
        finally:
            await adapter.aclose()

    with pytest.raises(ProviderError) as caught:
        anyio.run(go)
    return caught.value


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (lambda url: OpenAIAdapter(api_key=KEY, base_url=f"{url}/v1"), "/v1/chat/completions"),
        (lambda url: AnthropicAdapter(api_key=KEY, base_url=url), "/v1/messages"),
        (lambda url: GeminiAdapter(api_key=KEY, base_url=url), "/models/gpt-4o-mini:generateContent"),
    ],
    ids=["openai", "anthropic", "gemini"],
)
def test_a_server_not_listening_is_named_with_the_cause(make: Any, path: str) -> None:
    base = f"http://127.0.0.1:{closed_port()}"
    error = failure(make(base))
    assert error.code == "connection_error" and error.retryable
    assert error.message.startswith(f"connection error: cannot connect to {base}")
    assert error.message.endswith(f"{path} (connection refused)")
    assert KEY not in error.message


def test_a_host_that_does_not_resolve_is_named() -> None:
    error = failure(OpenAIAdapter(api_key=KEY, base_url="http://user:pw@no-such-host.invalid/v1"))
    assert error.message.startswith(
        "connection error: cannot connect to http://no-such-host.invalid/v1/chat/completions"
    )
    assert "host not found" in error.message
    assert "pw" not in error.message and KEY not in error.message
