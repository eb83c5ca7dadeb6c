"""One record per provider builds its adapters and checks its requests; checking never imports an SDK."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import pytest

from adapters.registry import (
    BATCH_PROVIDERS,
    PROVIDER_NAMES,
    STRUCTURED_OUTPUT_PROVIDERS,
    make_adapter,
    make_batch_adapter,
)
from ledger.settings import load_settings

SDKS = ("openai", "anthropic", "google")
# Settings under which every provider can be built without a key: servers of one's own.
LOCAL = {
    "OPENAI_BASE_URL": "http://127.0.0.1:8089/v1",
    "ANTHROPIC_BASE_URL": "http://127.0.0.1:8089",
    "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:8089",
    "AZURE_OPENAI_ENDPOINT": "http://127.0.0.1:8089",
    "OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:8000/v1",
}


def test_checking_a_request_for_every_provider_and_api_imports_no_sdk() -> None:
    probe = (
        "import json, sys\n"
        "from adapters.base import CallRequest\n"
        "from adapters.registry import PROVIDER_NAMES, wire_check\n"
        "request = CallRequest('m', [{'role': 'user', 'content': 'hi'}], params={'temperature': 1})\n"
        "said = {}\n"
        "for provider in sorted(PROVIDER_NAMES):\n"
        "    for api in (None, 'responses'):\n"
        "        check = wire_check(provider, api)\n"
        "        said[f'{provider} {api}'] = None if check is None else check(request)\n"
        "print(json.dumps([said, sorted(sys.modules)]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    said, loaded = json.loads(done.stdout)
    assert said["anthropic None"] == ["temperature"]  # the Messages API has no temperature parameter
    assert said["mock None"] is None and said["openai responses"] == []
    assert not [m for m in loaded if m.split(".")[0] in SDKS]


@pytest.mark.parametrize("provider", sorted(PROVIDER_NAMES))
def test_each_provider_builds_the_adapters_its_record_names(provider: str) -> None:
    settings = load_settings(_env_file=None, **LOCAL)
    adapter = make_adapter(provider, settings)
    assert adapter.name == provider
    assert adapter.supports_structured_output == (provider in STRUCTURED_OUTPUT_PROVIDERS)
    anyio.run(adapter.aclose)
    if provider in BATCH_PROVIDERS:
        batches = make_batch_adapter(provider, settings)
        assert batches.name == provider
        anyio.run(batches.aclose)
    else:
        with pytest.raises(ValueError, match=f"provider '{provider}' has no batch API"):
            make_batch_adapter(provider, settings)


def test_an_unknown_provider_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown provider 'nope'"):
        make_adapter("nope", load_settings(_env_file=None))
