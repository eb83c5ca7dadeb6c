"""Which providers need a key: only where the provider's own endpoint would be called."""

from __future__ import annotations

import pytest

from adapters.registry import make_adapter, missing_key
from ledger.settings import load_settings


@pytest.mark.parametrize(
    ("provider", "settings", "variable"),
    [
        ("openai", {}, "OPENAI_API_KEY"),
        ("openai", {"OPENAI_BASE_URL": "https://api.openai.com/v1"}, "OPENAI_API_KEY"),
        ("anthropic", {}, "ANTHROPIC_API_KEY"),
        ("gemini", {}, "GOOGLE_API_KEY or GEMINI_API_KEY"),
        ("azure", {"AZURE_OPENAI_ENDPOINT": "https://acme.openai.azure.com"}, "AZURE_OPENAI_API_KEY"),
    ],
)
def test_the_providers_own_endpoint_without_a_key_names_the_variable(
    provider: str, settings: dict[str, str], variable: str
) -> None:
    said = missing_key(provider, load_settings(_env_file=None, **settings))
    assert said is not None and said.startswith(f"{variable} is not set")
    with pytest.raises(ValueError, match=variable):
        make_adapter(provider, load_settings(_env_file=None, **settings))


@pytest.mark.parametrize(
    ("provider", "settings"),
    [
        ("openai", {"OPENAI_API_KEY": "k"}),
        ("openai", {"OPENAI_BASE_URL": "http://127.0.0.1:8089/v1"}),
        ("anthropic", {"ANTHROPIC_BASE_URL": "http://localhost:4000"}),
        ("gemini", {"GEMINI_API_KEY": "k"}),
        ("gemini", {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:8089"}),
        ("azure", {"AZURE_OPENAI_ENDPOINT": "http://127.0.0.1:8089"}),
        ("openai-compatible", {"OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:8000/v1"}),
        ("mock", {}),
    ],
)
def test_a_server_of_ones_own_or_a_key_needs_nothing_more(provider: str, settings: dict[str, str]) -> None:
    assert missing_key(provider, load_settings(_env_file=None, **settings)) is None
