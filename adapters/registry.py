"""Which providers exist, and how to build an adapter for one.

Kept apart from the adapters themselves so that validating a request (enqueue)
never imports an SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from adapters.base import Adapter, CallRequest
    from adapters.batch_interface import BatchAdapter
    from ledger.settings import Settings

PROVIDER_NAMES = frozenset({"openai", "anthropic", "azure", "gemini", "openai-compatible", "mock"})
# The APIs a request may name (`api`), and the providers whose servers answer OpenAI's Responses
# API (vLLM and others serve `/v1/responses`).
APIS = ("chat", "responses", "messages")
RESPONSES_PROVIDERS = frozenset({"openai", "azure", "openai-compatible", "mock"})
# Providers with a batch API; requests for the others with delivery=batch go online.
BATCH_PROVIDERS = frozenset({"openai", "anthropic", "azure", "gemini"})
# Providers whose adapter sends a JSON schema the model must follow: structured batching
# (BATCHING_ENABLED) asks them for every dimension at once; the others get one request
# per dimension (seed 000 FR-004). Matches each adapter's `supports_structured_output`.
STRUCTURED_OUTPUT_PROVIDERS = frozenset({"openai", "anthropic", "azure", "gemini", "mock"})
# The providers' own endpoints, which refuse a call without a key: (the key's variable, the base
# URL's variable, the host the SDK calls when that is unset). Azure's are the resource hosts
# under these domains.
_KEYED_HOSTS = {
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "api.openai.com"),
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "api.anthropic.com"),
    "gemini": ("GOOGLE_API_KEY or GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL", "generativelanguage.googleapis.com"),
}
_AZURE_DOMAINS = (".azure.com", ".azure.us", ".azure.cn")


def missing_key(provider: str, settings: Settings) -> str | None:
    """Why `provider` cannot be called for want of an API key (one line naming the variable), or
    None. A key is required only where the provider's own endpoint would be called: its default
    host, or a base URL naming that host (for Azure, a resource under Azure's domains). A base URL
    elsewhere (the mock provider, a proxy, a local server) may need none, as may
    `openai-compatible` and `mock`; without a key the SDK would send a placeholder that the
    provider refuses, which used to end as network errors naming nothing."""
    if provider == "azure":
        host = urlsplit(settings.azure_endpoint or "").hostname or ""
        if settings.azure_api_key or not host.endswith(_AZURE_DOMAINS):
            return None
        return f"AZURE_OPENAI_API_KEY is not set: provider 'azure' calls {host}, which needs it"
    if provider not in _KEYED_HOSTS:
        return None
    key_variable, url_variable, default_host = _KEYED_HOSTS[provider]
    key, base_url = {
        "openai": (settings.openai_api_key, settings.openai_base_url),
        "anthropic": (settings.anthropic_api_key, settings.anthropic_base_url),
        "gemini": (gemini_key(settings), settings.gemini_base_url),
    }[provider]
    host = (urlsplit(base_url).hostname or "") if base_url else default_host
    if key or host != default_host:
        return None
    return f"{key_variable} is not set: provider {provider!r} calls {host}, which needs it (or set {url_variable})"


def api_for(provider: str, api: str | None) -> str:
    """The API a request is called with: the Responses API when asked for, else the provider's
    own wire format (a chat request replayed on Anthropic is a Messages request, and back)."""
    if api == "responses":
        return api
    return "messages" if provider == "anthropic" else "chat"


@cache  # asked once per enqueued request: the lookup, not the imports, each time
def wire_check(provider: str, api: str | None) -> Callable[[CallRequest], list[str]] | None:
    """The pure check enqueue makes of a request for `provider` (SDK-free: the module that writes
    its body): the names of the parameters left out, or `Untranslatable` for what the provider's
    API cannot express. None: the provider takes requests as given (the in-process mock)."""
    if provider == "anthropic":
        from adapters.anthropic_format import check

        return check
    if provider == "gemini":
        from adapters.gemini_format import check as gemini_check

        return gemini_check
    if provider == "mock":
        return None
    if api == "responses":
        from adapters.openai_responses import check as responses_check

        return partial(responses_check, provider=provider)
    from adapters.openai_chat import check as chat_check

    return partial(chat_check, provider=provider)


def make_adapter(provider: str, settings: Settings) -> Adapter:
    """A ready adapter for `provider`, configured from settings (keys never leave it). Raises
    ValueError (one line) when a setting it needs is missing: its key, its endpoint."""
    missing = missing_key(provider, settings)
    if missing is not None:
        raise ValueError(missing)
    if provider == "openai":
        from adapters.openai import OpenAIAdapter

        return OpenAIAdapter(api_key=settings.openai_api_key, base_url=settings.openai_base_url)
    if provider == "anthropic":
        from adapters.anthropic import AnthropicAdapter

        return AnthropicAdapter(api_key=settings.anthropic_api_key, base_url=settings.anthropic_base_url)
    if provider == "azure":
        from adapters.azure import AzureAdapter

        return AzureAdapter(
            endpoint=azure_endpoint(settings), api_key=settings.azure_api_key, api_version=settings.azure_api_version
        )
    if provider == "gemini":
        from adapters.gemini import GeminiAdapter

        return GeminiAdapter(api_key=gemini_key(settings), base_url=settings.gemini_base_url)
    if provider == "openai-compatible":
        from adapters.compatible import CompatibleAdapter

        if not settings.compatible_base_url:
            raise ValueError("OPENAI_COMPATIBLE_BASE_URL must be set for provider 'openai-compatible'")
        return CompatibleAdapter(api_key=settings.compatible_api_key, base_url=settings.compatible_base_url)
    if provider == "mock":
        from adapters.mock import MockAdapter

        return MockAdapter()
    raise ValueError(f"unknown provider {provider!r} (known: {', '.join(sorted(PROVIDER_NAMES))})")


def make_batch_adapter(provider: str, settings: Settings) -> BatchAdapter:
    """The batch API of `provider` (one of BATCH_PROVIDERS), configured like its online adapter."""
    if provider == "openai":
        from adapters.openai_batches import OpenAIBatches

        return OpenAIBatches(api_key=settings.openai_api_key, base_url=settings.openai_base_url)
    if provider == "anthropic":
        from adapters.anthropic_batches import AnthropicBatches

        return AnthropicBatches(api_key=settings.anthropic_api_key, base_url=settings.anthropic_base_url)
    if provider == "azure":
        from adapters.azure_batches import AzureBatches

        return AzureBatches(
            endpoint=azure_endpoint(settings), api_key=settings.azure_api_key, api_version=settings.azure_api_version
        )
    if provider == "gemini":
        from adapters.gemini_batches import GeminiBatches

        return GeminiBatches(api_key=gemini_key(settings), base_url=settings.gemini_base_url)
    raise ValueError(f"provider {provider!r} has no batch API (batch providers: {', '.join(sorted(BATCH_PROVIDERS))})")


def gemini_key(settings: Settings) -> str | None:
    """The Gemini API key by the SDK's convention: GOOGLE_API_KEY over GEMINI_API_KEY."""
    return settings.google_api_key or settings.gemini_api_key


def azure_endpoint(settings: Settings) -> str:
    """AZURE_OPENAI_ENDPOINT, which provider `azure` cannot do without."""
    if not settings.azure_endpoint:
        raise ValueError("AZURE_OPENAI_ENDPOINT must be set for provider 'azure'")
    return settings.azure_endpoint
