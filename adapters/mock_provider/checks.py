"""Every request the mock provider is sent, checked against its provider's own definition before
it is answered (OpenAI: `openai_checks`; Anthropic: `anthropic_checks`; Gemini: `gemini_checks`),
and a refusal written as that provider writes it: online, a 400 with its error body; in a batch,
the per-line error its results carry (`batches.py`).

The checks are compiled once per process: a few to some tens of microseconds a request
(`bench.mock_checks` times them), so neither the online benchmarks nor a 100,000-line batch
notice them. The SDKs whose types they read take seconds to import: a server compiles those in a
thread as it starts (`warm_soon`); a request that needs them first waits for them.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

from adapters.mock_provider import anthropic_checks, openai_checks
from adapters.mock_provider.openai_checks import Refusal

_SCHEMAS = {"openai": openai_checks.CHAT, "azure": openai_checks.CHAT, "chat": openai_checks.CHAT}


def warm() -> None:
    """Import and compile every check now; then leave what that made out of the garbage
    collector's full passes (the SDKs' types are hundreds of thousands of objects: walked again
    at each, they paused the server for tens of milliseconds, enough to reorder calls racing for a
    rate window)."""
    from adapters.mock_provider import gemini_checks  # imports google-genai's types

    openai_checks.warm()
    anthropic_checks.warm()
    gemini_checks.warm()
    gc.freeze()


def warm_soon() -> None:
    """OpenAI's checks now (tens of milliseconds), the SDK-typed ones in a thread of their own (a
    check asked for meanwhile waits on Python's import lock or compiles its part itself)."""
    openai_checks.warm()
    threading.Thread(target=warm, name="mock-checks-warm", daemon=True).start()


def check(wire: str, body: Any) -> Refusal | None:
    """None when the provider of `wire` (openai | azure | chat | responses | anthropic | gemini)
    takes `body` as a model call; else its refusal."""
    if wire == "anthropic":
        return anthropic_checks.check_message(body)
    if wire == "gemini":
        from adapters.mock_provider import gemini_checks

        return gemini_checks.check_generate(body)
    if wire == "responses":
        return openai_checks.check_request(openai_checks.RESPONSES, body)
    return openai_checks.check_request(_SCHEMAS[wire], body)


def unparsable(wire: str) -> Refusal:
    """The refusal of a body that is not JSON, in the provider's words."""
    if wire == "gemini":
        return Refusal("Invalid JSON payload received. Unexpected token.")
    if wire == "anthropic":
        return Refusal("There was an error parsing the body")
    return Refusal(
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP"
        " library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)"
    )


def error_body(wire: str, refusal: Refusal, status: int = 400) -> dict[str, Any]:
    """The provider's error body for a refused request."""
    if wire == "anthropic":
        return {"type": "error", "error": {"type": "invalid_request_error", "message": refusal.message}}
    if wire == "gemini":
        return {"error": {"code": status, "message": refusal.message, "status": "INVALID_ARGUMENT"}}
    error = {"message": refusal.message, "type": "invalid_request_error", "param": refusal.param, "code": refusal.code}
    return {"error": error}
