"""A request's output-token limit, whichever of its three names the caller gave it.

OpenAI's chat API calls it `max_completion_tokens` (its older `max_tokens` is deprecated and
refused by reasoning models), Anthropic's Messages API `max_tokens`, the Responses API
`max_output_tokens` (Gemini: `maxOutputTokens`). A stored request keeps the name its caller
used; every reader (the adapters writing a request, the price estimates, the parse messages)
asks here, so two names on one request are read in one order everywhere: the first named in
`OUTPUT_LIMIT_NAMES` wins, and an adapter leaves the others out of the wire body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

OUTPUT_LIMIT_NAMES: Final = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def output_limit(params: Mapping[str, Any] | None) -> Any:
    """The limit the request asks for (None: none given)."""
    if not params:
        return None
    for name in OUTPUT_LIMIT_NAMES:
        value = params.get(name)
        if value:
            return value
    return None


def spare_limits(params: Mapping[str, Any]) -> list[str]:
    """The limit names given besides the one `output_limit` reads: never sent, named as dropped."""
    given = [name for name in OUTPUT_LIMIT_NAMES if params.get(name)]
    return given[1:]
