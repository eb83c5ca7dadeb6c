"""Which providers exist, and how to build an adapter for one: one record per provider
(`PROVIDERS`) names its online adapter, its batch adapter and the check enqueue makes of its
requests, and says which APIs and answer formats it serves.

The adapters and checks are named as `module:attribute` and imported on first use, so that
validating a request (enqueue) never imports an SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from adapters.base import Adapter, CallRequest
    from adapters.batch_interface import BatchAdapter
    from ledger.settings import Settings


@dataclass(frozen=True)
class Provider:
    """What the ledger knows of one provider. `adapter` and `batches` (None: no batch API) are
    classes built with the keyword arguments `config` reads from settings (the same for both:
    one client configuration per provider); `check` is the pure check enqueue makes of a request
    (None: requests are taken as given), `responses_check` the one for a request to OpenAI's
    Responses API; `check_names_provider`: the check is shared by several providers and is told
    which one it checks for. `responses_api`: its servers answer the Responses API.
    `structured_output`: its adapter sends a JSON schema the model must follow (structured
    batching, BATCHING_ENABLED, asks it for every dimension at once; the others get one request
    per dimension), matching the adapter's `supports_structured_output`."""

    adapter: str
    config: Callable[[Settings], dict[str, Any]]
    batches: str | None = None
    check: str | None = None
    responses_check: str | None = None
    check_names_provider: bool = False
    responses_api: bool = False
    structured_output: bool = True


def _openai_config(settings: Settings) -> dict[str, Any]:
    return {"api_key": settings.openai_api_key, "base_url": settings.openai_base_url}


def _anthropic_config(settings: Settings) -> dict[str, Any]:
    return {"api_key": settings.anthropic_api_key, "base_url": settings.anthropic_base_url}


def _azure_config(settings: Settings) -> dict[str, Any]:
    return {
        "endpoint": azure_endpoint(settings),
        "api_key": settings.azure_api_key,
        "api_version": settings.azure_api_version,
    }


def _gemini_config(settings: Settings) -> dict[str, Any]:
    return {"api_key": gemini_key(settings), "base_url": settings.gemini_base_url}


def _compatible_config(settings: Settings) -> dict[str, Any]:
    if not settings.compatible_base_url:
        raise ValueError("OPENAI_COMPATIBLE_BASE_URL must be set for provider 'openai-compatible'")
    return {"api_key": settings.compatible_api_key, "base_url": settings.compatible_base_url}


# OpenAI's wire format, which Azure and OpenAI-compatible servers share.
_CHAT_CHECK = "adapters.openai_chat:check"
_RESPONSES_CHECK = "adapters.openai_responses:check"
PROVIDERS: dict[str, Provider] = {
    "openai": Provider(
        "adapters.openai:OpenAIAdapter",
        _openai_config,
        batches="adapters.openai_batches:OpenAIBatches",
        check=_CHAT_CHECK,
        responses_check=_RESPONSES_CHECK,
        check_names_provider=True,
        responses_api=True,
    ),
    "anthropic": Provider(
        "adapters.anthropic:AnthropicAdapter",
        _anthropic_config,
        batches="adapters.anthropic_batches:AnthropicBatches",
        check="adapters.anthropic_format:check",
    ),
    "azure": Provider(
        "adapters.azure:AzureAdapter",
        _azure_config,
        batches="adapters.azure_batches:AzureBatches",
        check=_CHAT_CHECK,
        responses_check=_RESPONSES_CHECK,
        check_names_provider=True,
        responses_api=True,
    ),
    "gemini": Provider(
        "adapters.gemini:GeminiAdapter",
        _gemini_config,
        batches="adapters.gemini_batches:GeminiBatches",
        check="adapters.gemini_format:check",
    ),
    "openai-compatible": Provider(
        "adapters.compatible:CompatibleAdapter",
        _compatible_config,
        check=_CHAT_CHECK,
        responses_check=_RESPONSES_CHECK,
        check_names_provider=True,
        responses_api=True,
        structured_output=False,
    ),
    "mock": Provider("adapters.mock:MockAdapter", lambda settings: {}, responses_api=True),
}
PROVIDER_NAMES = frozenset(PROVIDERS)
# The APIs a request may name (`api`), and the providers whose servers answer OpenAI's Responses
# API (vLLM and others serve `/v1/responses`).
APIS = ("chat", "responses", "messages")
RESPONSES_PROVIDERS = frozenset(name for name, p in PROVIDERS.items() if p.responses_api)
# Providers with a batch API; requests for the others with delivery=batch go online.
BATCH_PROVIDERS = frozenset(name for name, p in PROVIDERS.items() if p.batches is not None)
STRUCTURED_OUTPUT_PROVIDERS = frozenset(name for name, p in PROVIDERS.items() if p.structured_output)
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
    entry = PROVIDERS[provider]
    target = entry.responses_check if api == "responses" and entry.responses_check else entry.check
    if target is None:
        return None
    check = cast("Callable[..., list[str]]", _imported(target))
    return partial(check, provider=provider) if entry.check_names_provider else check


def make_adapter(provider: str, settings: Settings) -> Adapter:
    """A ready adapter for `provider`, configured from settings (keys never leave it). Raises
    ValueError (one line) when a setting it needs is missing: its key, its endpoint."""
    missing = missing_key(provider, settings)
    if missing is not None:
        raise ValueError(missing)
    entry = PROVIDERS.get(provider)
    if entry is None:
        raise ValueError(f"unknown provider {provider!r} (known: {', '.join(sorted(PROVIDER_NAMES))})")
    config = entry.config(settings)
    return cast("Adapter", _imported(entry.adapter)(**config))


def make_batch_adapter(provider: str, settings: Settings) -> BatchAdapter:
    """The batch API of `provider` (one of BATCH_PROVIDERS), configured like its online adapter."""
    entry = PROVIDERS.get(provider)
    if entry is None or entry.batches is None:
        batch_providers = ", ".join(sorted(BATCH_PROVIDERS))
        raise ValueError(f"provider {provider!r} has no batch API (batch providers: {batch_providers})")
    config = entry.config(settings)
    return cast("BatchAdapter", _imported(entry.batches)(**config))


def _imported(target: str) -> Any:
    """The attribute a `module:attribute` name names, its module imported now (on first use)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def gemini_key(settings: Settings) -> str | None:
    """The Gemini API key by the SDK's convention: GOOGLE_API_KEY over GEMINI_API_KEY."""
    return settings.google_api_key or settings.gemini_api_key


def azure_endpoint(settings: Settings) -> str:
    """AZURE_OPENAI_ENDPOINT, which provider `azure` cannot do without."""
    if not settings.azure_endpoint:
        raise ValueError("AZURE_OPENAI_ENDPOINT must be set for provider 'azure'")
    return settings.azure_endpoint
