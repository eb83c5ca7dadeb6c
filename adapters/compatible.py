"""OpenAI-compatible servers (Ollama, OpenRouter, vLLM): the OpenAI SDK with a base URL."""

from __future__ import annotations

from adapters.openai import OpenAIAdapter


class CompatibleAdapter(OpenAIAdapter):
    name = "openai-compatible"

    def __init__(self, *, api_key: str | None, base_url: str) -> None:
        super().__init__(api_key=api_key, base_url=base_url)

    @property
    def supports_structured_output(self) -> bool:
        # Many local servers accept `response_format` but ignore the schema; the
        # structured-batching stage falls back to one call per dimension.
        return False
