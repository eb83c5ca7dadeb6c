"""Gemini's parts in OpenAI chat's words, for the other providers' writers (OpenAI chat,
Anthropic): a conversation stored in Gemini's words replays on them through this reader.

Kept apart from `gemini_format` (which writes `generateContent` requests) so that the writers of
each provider can read the others' words without importing each other's modules.
"""

from __future__ import annotations

from typing import Any

from adapters.translation import Untranslatable, arguments_text


def chat_conversation(messages: list[dict[str, Any]], provider: str, dropped: list[str] | None) -> list[dict[str, Any]]:
    """Stored messages with every Gemini part in OpenAI chat's words: `functionCall` parts as
    `tool_calls` (ids as Gemini gave them, else `call_N`), `functionResponse` parts as `tool`
    messages answering them, inline images as `image_url` data. What chat cannot say is refused."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (id, name) of the calls not answered yet
    for i, message in enumerate(messages):
        content = message.get("content")
        if type(content) is not list or all(isinstance(p, dict) and "type" in p for p in content):
            out.append(message)
            continue
        texts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            at = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict):
                raise Untranslatable(at, provider, "takes content parts only as objects")
            if dropped is not None and "thoughtSignature" in part:
                dropped.append("thoughtSignature")
            if "functionCall" in part:
                call = part["functionCall"]
                call_id = str(call.get("id") or f"call_{len(pending) + len(calls)}")
                function = {"name": call.get("name"), "arguments": arguments_text(call.get("args") or {})}
                calls.append({"id": call_id, "type": "function", "function": function})
            elif "functionResponse" in part:
                out.append(_tool_message(part["functionResponse"], pending))
            elif "text" in part and not part.get("thought"):
                texts.append({"type": "text", "text": str(part["text"])})
            elif "inlineData" in part:
                data = part["inlineData"]
                url = f"data:{data.get('mimeType')};base64,{data.get('data')}"
                texts.append({"type": "image_url", "image_url": {"url": url}})
            elif "type" not in part:
                raise Untranslatable(at, provider, f"has no part like Gemini's {sorted(part)[0]!r}")
            else:
                texts.append(part)
        pending.extend((c["id"], c["function"]["name"]) for c in calls)
        out.extend(_chat_turn(message.get("role"), texts, calls))
    return out


def _tool_message(response: dict[str, Any], pending: list[tuple[str, str]]) -> dict[str, Any]:
    name = response.get("name")
    found = next((p for p in pending if response.get("id") in (p[0], None) and p[1] == name), None)
    if found is not None:
        pending.remove(found)
    call_id = str(response.get("id") or (found[0] if found else name))
    said = response.get("response")
    text = said["result"] if isinstance(said, dict) and set(said) == {"result"} else arguments_text(said or {})
    return {"role": "tool", "tool_call_id": call_id, "content": str(text)}


def _chat_turn(role: Any, parts: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    plain = all(p.get("type") == "text" for p in parts)
    content: Any = "".join(str(p.get("text")) for p in parts) if plain else parts
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": content or None}
        return [turn | ({"tool_calls": calls} if calls else {})]
    return [{"role": "user", "content": content}] if parts else []
