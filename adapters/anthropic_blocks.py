"""Anthropic's blocks in OpenAI chat's words, for the other providers' writers (OpenAI chat,
Gemini): a conversation stored in Anthropic's words replays on them through this reader.

Kept apart from `anthropic_format` (which writes Messages bodies) so that the writers of each
provider can read the others' words without importing each other's modules.
"""

from __future__ import annotations

from typing import Any, Final

from adapters.translation import Untranslatable, arguments_text, text_of

# Block types only Anthropic writes: a message holding one is in Anthropic's words.
BLOCK_TYPES: Final = frozenset(
    {
        "tool_use",
        "tool_result",
        "image",
        "document",
        "thinking",
        "redacted_thinking",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "container_upload",
    }
)


def chat_conversation(
    system: Any, messages: list[dict[str, Any]], provider: str, dropped: list[str] | None
) -> tuple[str | None, list[dict[str, Any]]]:
    """A stored system and messages with every Anthropic block in OpenAI chat's words (`tool_use`
    blocks as `tool_calls`, `tool_result` blocks as `tool` messages, images as `image_url`
    parts); `cache_control` marks are left out and named. What chat cannot say is refused."""
    text = _system_text(system, dropped) if isinstance(system, list) else system
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if type(content) is not list or not any(_anthropic_block(p) for p in content):
            out.append(message)
        elif message.get("role") == "assistant":
            out.append(_chat_assistant(content, f"messages[{i}]", provider, dropped))
        else:
            out.extend(_chat_user(message, f"messages[{i}]", provider, dropped))
    return text, out


def _anthropic_block(part: Any) -> bool:
    return isinstance(part, dict) and (part.get("type") in BLOCK_TYPES or "cache_control" in part)


def _system_text(blocks: list[Any], dropped: list[str] | None) -> str:
    if dropped is not None and any(isinstance(b, dict) and "cache_control" in b for b in blocks):
        dropped.append("cache_control")
    return text_of(blocks)


def _chat_assistant(blocks: list[Any], where: str, provider: str, dropped: list[str] | None) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text") or ""))
            if dropped is not None and "cache_control" in block:
                dropped.append("cache_control")
        elif kind == "tool_use":
            function = {"name": block.get("name"), "arguments": arguments_text(block.get("input") or {})}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        else:
            raise Untranslatable(f"{where}.content[{j}].type", provider, f"has no {kind!r} block in an assistant turn")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _chat_user(message: dict[str, Any], where: str, provider: str, dropped: list[str] | None) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(message["content"]):
        at = f"{where}.content[{j}]"
        if not isinstance(block, dict):
            raise Untranslatable(at, provider, "takes content parts only as objects")
        if dropped is not None and "cache_control" in block:
            dropped.append("cache_control")
        kind = block.get("type")
        if kind == "tool_result":
            if block.get("is_error"):
                raise Untranslatable(f"{at}.is_error", provider, "has no error mark for a tool result")
            content = block.get("content")
            text = content if isinstance(content, str) else text_of(content)
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": str(block.get("text") or "")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at, provider)}})
        else:
            raise Untranslatable(f"{at}.type", provider, f"has no {kind!r} block")
    if parts:
        plain = all(p["type"] == "text" for p in parts)
        results.append({"role": "user", "content": "".join(p["text"] for p in parts) if plain else parts})
    return results


def _image_url(block: dict[str, Any], where: str, provider: str) -> str:
    source = block.get("source") or {}
    if source.get("type") == "url":
        return str(source.get("url"))
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    raise Untranslatable(f"{where}.source", provider, f"has no {source.get('type')!r} image source")
