"""What Anthropic refuses, checked the way its API checks it: a Messages request body against the
pinned `anthropic` SDK's request types (`MessageCreateParams` and every TypedDict it holds; a key
none of them declares is refused, "X: Extra inputs are not permitted"), a Message Batch's entries
(`custom_id` and `params`, nothing else), and the rules the API adds: a `tool_result` answers a
`tool_use` of the message before it, and every `tool_use` is answered in the next message.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from adapters.mock_provider.openai_checks import Refusal
from adapters.mock_provider.typed_checks import Check, Invalid, TypedChecks


@cache
def _params_check() -> Check:
    from anthropic.types import MessageCreateParams  # seconds to import: only once it is needed

    return TypedChecks().check(MessageCreateParams)


def warm() -> None:
    """Compile the check now (a first request should not pay for it)."""
    _params_check()


def check_message(body: Any) -> Refusal | None:
    """None when Anthropic takes `body` as a Messages request; else its refusal."""
    try:
        _params_check()(body)
    except Invalid as exc:
        return Refusal(exc.said())
    return _tool_links(body["messages"])


def check_batch_entry(entry: Any, index: int) -> Refusal | None:
    """An entry of a Message Batch create: `custom_id` and `params` (what the create refuses
    outright; the params themselves are checked as the batch runs, `check_message`)."""
    where = f"requests.{index}"
    if not isinstance(entry, dict):
        return Refusal(f"{where}: Input should be a valid dictionary")
    for key in entry:
        if key not in ("custom_id", "params"):
            return Refusal(f"{where}.{key}: Extra inputs are not permitted")
    for key in ("custom_id", "params"):
        if key not in entry:
            return Refusal(f"{where}.{key}: Field required")
    if not isinstance(entry["custom_id"], str):
        return Refusal(f"{where}.custom_id: Input should be a valid string")
    if not isinstance(entry["params"], dict):
        return Refusal(f"{where}.params: Input should be a valid dictionary")
    return None


def _blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind]


def _tool_links(messages: list[dict[str, Any]]) -> Refusal | None:
    """Anthropic's own words when a tool result has no call before it, or a call no result after."""
    calls: set[str] = set()
    for i, message in enumerate(messages):
        results = _blocks(message, "tool_result")
        unknown = [str(b.get("tool_use_id")) for b in results if b.get("tool_use_id") not in calls]
        if unknown:
            at = next(j for j, b in enumerate(message["content"]) if b in results)
            return Refusal(
                f"messages.{i}.content.{at}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{', '.join(unknown)}. Each `tool_result` block must have a corresponding `tool_use` block in"
                " the previous message."
            )
        answered = {str(b.get("tool_use_id")) for b in results}
        if calls - answered:
            return Refusal(
                f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(sorted(calls - answered))}. Each `tool_use` block must have a corresponding"
                " `tool_result` block in the next message."
            )
        made = _blocks(message, "tool_use") if message.get("role") == "assistant" else []
        calls = {str(b.get("id")) for b in made}
    return None


def check_batch_create(body: Any) -> Refusal | None:
    """A Message Batch create's body: `requests`, a list of entries (`check_batch_entry`)."""
    if not isinstance(body, dict):
        return Refusal("Input should be a valid dictionary")
    for key in body:
        if key != "requests":
            return Refusal(f"{key}: Extra inputs are not permitted")
    requests = body.get("requests")
    if not isinstance(requests, list):
        return Refusal("requests: Field required" if requests is None else "requests: Input should be a valid list")
    for i, entry in enumerate(requests):
        refusal = check_batch_entry(entry, i)
        if refusal is not None:
            return refusal
    return None
