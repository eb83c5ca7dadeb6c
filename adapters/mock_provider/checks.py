"""Every request the mock provider is sent, checked against its provider's own definition before
it is answered (OpenAI: `openai_checks`; Anthropic: `anthropic_checks`; Gemini: `gemini_checks`),
and a refusal written as that provider writes it: online, a 400 with its error body; in a batch,
the per-line error its results carry (`batches.py`).

The checks are compiled once per process: a few to some tens of microseconds a request
(`bench.mock_checks` times them), so neither the online benchmarks nor a 100,000-line batch
notice them. OpenAI's are compiled as a server starts (`warm_soon`, tens of milliseconds); the
SDK-typed ones (Anthropic's, Gemini's: seconds of imports) by the first request that needs them,
so a run that speaks only OpenAI never pays for them, and no background compile competes with the
server for the interpreter while it answers. In the mock's own process (`freeze_when_built`) what
they built is then left out of the collector's full passes: hundreds of thousands of objects,
walked again at each, paused the server for tens of milliseconds, enough to reorder calls racing
for a rate window. A mock run in a thread of another program never freezes that program's objects.
"""

from __future__ import annotations

import gc
from typing import Any

from adapters.mock_provider import anthropic_checks, openai_checks
from adapters.mock_provider.openai_checks import Refusal

_SCHEMAS = {"openai": openai_checks.CHAT, "azure": openai_checks.CHAT, "chat": openai_checks.CHAT}


def warm() -> None:
    """Import and compile every check now (a benchmark times them warm)."""
    from adapters.mock_provider import gemini_checks  # imports google-genai's types

    openai_checks.warm()
    anthropic_checks.warm()
    gemini_checks.warm()


def warm_soon() -> None:
    """OpenAI's checks now (tens of milliseconds); the SDK-typed ones when first asked for."""
    openai_checks.warm()


_FREEZE_ASKED = False
_BUILT: set[str] = set()


def freeze_when_built() -> None:
    """The mock is the whole process (its command): once a wire's SDK-typed check is built, what
    it built is frozen out of the collector's full passes (a freeze is process-wide)."""
    global _FREEZE_ASKED
    _FREEZE_ASKED = True


def _built(wire: str) -> None:
    if wire not in _BUILT:
        _BUILT.add(wire)
        if _FREEZE_ASKED:
            gc.freeze()


def check(wire: str, body: Any) -> Refusal | None:
    """None when the provider of `wire` (openai | azure | chat | responses | anthropic | gemini)
    takes `body` as a model call; else its refusal."""
    if wire == "anthropic":
        refusal = anthropic_checks.check_message(body)
        _built(wire)
        return refusal
    if wire == "gemini":
        from adapters.mock_provider import gemini_checks

        refusal = gemini_checks.check_generate(body)
        _built(wire)
        return refusal
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
