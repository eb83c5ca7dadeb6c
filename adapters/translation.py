"""What the request writers of every provider share: the refusal of what a target cannot say, and
the small conversions between the providers' ways of writing the same thing.

A stored conversation keeps each message and part in the shape its caller wrote it (OpenAI chat,
Anthropic Messages, Gemini parts: each recognisable by its keys). The target provider's writer
turns what is not already its own into its own; what its API has no way to say is refused when the
request is enqueued (`Untranslatable`, one line naming the field and the provider), never sent
mangled. Sampling parameters a target does not take are left out and named (`dropped`).
"""

from __future__ import annotations

import json
from typing import Any


class Untranslatable(ValueError):
    """A request holds something the target provider's API cannot express."""

    def __init__(self, where: str, provider: str, what: str) -> None:
        super().__init__(f"{where}: {provider} {what}")


def arguments_object(text: Any, where: str, provider: str) -> dict[str, Any]:
    """A tool call's argument text as the object Anthropic and Gemini take."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise Untranslatable(where, provider, "takes tool call arguments only as a JSON object")
    return value


def arguments_text(value: Any) -> str:
    """An argument object as the text OpenAI carries (compact, keys in the given order)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def data_url(url: str) -> tuple[str, str] | None:
    """(media type, base64 data) of a `data:` URL in base64, else None."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    media_type, _, encoding = head.partition(";")
    return (media_type, data) if sep and encoding == "base64" else None


def text_of(content: Any) -> str:
    """The text of a content: a string, or the text of its text parts (any provider's)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and not p.get("thought"))
    return ""
