"""The in-process mock provider: the mock server's answers without the network.

Used by unit tests and by the overhead benchmark, where the point is to measure
the ledger and nothing else. Answers come from the same generator the mock
server uses, so a run against either gives the same text for the same prompt.
"""

from __future__ import annotations

import anyio

from adapters.base import CallRequest, CallResult
from adapters.mock_provider.answers import chat_answer


class MockAdapter:
    name = "mock"

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency
        self.calls = 0

    @property
    def supports_structured_output(self) -> bool:
        return True

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        self.calls += 1
        if self.latency:
            await anyio.sleep(self.latency)
        else:
            await anyio.lowlevel.checkpoint()
        answer = chat_answer(request.model, request.system, request.messages, request.response_format)
        # In process there is no body to keep: the answer's fields are all there is.
        return CallResult(
            answer.text, answer.input_tokens, answer.output_tokens, finish_reason="stop", provider_finish_reason="stop"
        )

    async def aclose(self) -> None:
        return None
