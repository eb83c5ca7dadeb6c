"""Azure OpenAI through the official SDK's `AsyncAzureOpenAI`, with its retries off.

The wire format is OpenAI's: chat completions at `/openai/deployments/{deployment}/chat/completions`
and the Responses API at `/openai/responses`, both with `api-version` (the SDK builds the URLs
from `AZURE_OPENAI_ENDPOINT` and `OPENAI_API_VERSION`). A request's model is the deployment, a
name of the user's own; the answer names the model behind it (`gpt-4o-2024-08-06`), and that is
what prices it, at OpenAI's rates (`CallResult.priced_as`).
"""

from __future__ import annotations

from dataclasses import replace

import openai

from adapters.base import CallRequest, CallResult
from adapters.openai import OpenAIAdapter

# The SDK's own default is no version at all (every call refused); this one has chat, the
# Responses API and batches.
DEFAULT_API_VERSION = "2025-03-01-preview"


def azure_client(endpoint: str, api_key: str | None, api_version: str | None) -> openai.AsyncAzureOpenAI:
    """The SDK's Azure client, its retries off; the key goes to it and nowhere else (never logged,
    never stored)."""
    return openai.AsyncAzureOpenAI(
        azure_endpoint=endpoint,
        api_key=api_key or "not-needed",
        api_version=api_version or DEFAULT_API_VERSION,
        max_retries=0,
    )


def priced_by_answer(result: CallResult) -> CallResult:
    """Priced as the OpenAI model the answer names, when it names one."""
    model = result.response.get("model") if isinstance(result.response, dict) else None
    return replace(result, priced_as=("openai", model)) if isinstance(model, str) and model else result


class AzureAdapter(OpenAIAdapter):
    name = "azure"

    def __init__(self, *, endpoint: str, api_key: str | None, api_version: str | None) -> None:
        self._client = azure_client(endpoint, api_key, api_version)

    async def call(self, request: CallRequest, *, timeout: float) -> CallResult:
        return priced_by_answer(await super().call(request, timeout=timeout))
