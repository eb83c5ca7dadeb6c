"""Gemini's wire format (`generateContent`), both ways, with no SDK import: enqueue reads Gemini's
own batch-input lines with it, and the online and batch adapters write requests and read answers.

The ledger stores requests in OpenAI's vocabulary (system text, `messages`, `params`, a response
format), so a request made for one provider replays on another. Gemini's differs: the system text
is `systemInstruction`, messages are `contents` whose roles are `user` and `model`, sampling knobs
live in `generationConfig` under their own names, a JSON schema is `responseJsonSchema` beside
`responseMimeType`. What has no counterpart in OpenAI's vocabulary (a Gemini line's
`thinkingConfig`, `safetySettings`, native tools, non-text parts) is kept under Gemini's own name
and passed through unchanged, so a Gemini line loses nothing on its way through the ledger.
"""

from __future__ import annotations

from typing import Any

from adapters.anthropic_blocks import BLOCK_TYPES as ANTHROPIC_BLOCKS
from adapters.anthropic_blocks import chat_conversation as anthropic_chat
from adapters.base import CallRequest, CallResult, ToolCall, finish_reason, joined, token_count
from adapters.base import arguments_text as answer_arguments
from adapters.token_limit import OUTPUT_LIMIT_NAMES, output_limit, spare_limits
from adapters.translation import Untranslatable, arguments_object, data_url

# The ledger's params (OpenAI's names) and their `generationConfig` names.
_TO_CONFIG = {
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "stop": "stopSequences",
    "stop_sequences": "stopSequences",
    "seed": "seed",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
    "n": "candidateCount",
}
# And back, for a Gemini line read at enqueue.
_FROM_CONFIG = {
    "temperature": "temperature",
    "topP": "top_p",
    "topK": "top_k",
    "maxOutputTokens": "max_tokens",
    "stopSequences": "stop",
    "seed": "seed",
    "presencePenalty": "presence_penalty",
    "frequencyPenalty": "frequency_penalty",
    "candidateCount": "n",
}
# `generationConfig` fields with no OpenAI name: kept in params under Gemini's name.
_NATIVE_CONFIG = frozenset(
    {
        "thinkingConfig",
        "responseModalities",
        "mediaResolution",
        "responseLogprobs",
        "logprobs",
        "speechConfig",
        "enableEnhancedCivicAnswers",
        "imageConfig",
    }
)
# Top-level request fields kept in params under Gemini's name.
_NATIVE_REQUEST = frozenset({"safetySettings", "toolConfig", "cachedContent", "labels"})
# Params written elsewhere in the request than `generationConfig` (not left out).
_NOT_CONFIG = frozenset({*_NATIVE_REQUEST, *OUTPUT_LIMIT_NAMES, "tools", "tool_choice"})
# OpenAI's and Anthropic's tool choices as Gemini's function-calling modes.
_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY", "any": "ANY"}
PROVIDER = "gemini"
# Where the JSON schema of a structured answer goes.
_SCHEMA_KEYS = ("responseJsonSchema", "responseSchema")


def wire_request(call: CallRequest, dropped: list[str] | None = None) -> dict[str, Any]:
    """A stored request as Gemini's `GenerateContentRequest` (camelCase, without the model);
    `dropped` collects the names of what is left out. `Untranslatable` for what Gemini cannot say."""
    system, messages = call.system, call.messages
    if isinstance(system, list) or any(_anthropic_shaped(m) for m in messages):
        system, messages = anthropic_chat(system, messages, PROVIDER, dropped)
    systems: list[str] = [system] if isinstance(system, str) and system else []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the tool results that follow
    results: dict[str, Any] | None = None  # the user content holding the latest tool results
    for i, message in enumerate(messages):
        role = message.get("role")
        if role in ("system", "developer"):
            systems.append(_text(message.get("content")))
            continue
        if role == "tool":
            if results is None:
                results = {"role": "user", "parts": []}
                contents.append(results)
            results["parts"].append(_function_response(message, names))
            continue
        if "name" in message:
            raise Untranslatable(f"messages[{i}].name", PROVIDER, "has no name for a message's author")
        parts = _parts(message, names, i)
        if results is not None and role == "user":  # text after tool results: the same turn
            results["parts"].extend(parts)
        elif parts:
            contents.append({"role": "model" if role in ("assistant", "model") else "user", "parts": parts})
        results = None
    body: dict[str, Any] = {"contents": contents}
    if systems:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(systems)}]}
    config = _generation_config(call.params, call.response_format, dropped)
    if config:
        body["generationConfig"] = config
    tools = _tools(call.params.get("tools"))
    if tools:
        body["tools"] = tools
    for key in _NATIVE_REQUEST:
        if key in call.params:
            body[key] = call.params[key]
    if "tool_choice" in call.params and "toolConfig" not in call.params:
        body["toolConfig"] = _tool_config(call.params["tool_choice"])
    return body


def check(call: CallRequest) -> list[str]:
    """What enqueue asks: the parameters left out of the request's body (`Untranslatable` raised)."""
    dropped: list[str] = []
    wire_request(call, dropped)
    return dropped


def _anthropic_shaped(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return type(content) is list and any(
        isinstance(p, dict) and (p.get("type") in ANTHROPIC_BLOCKS or "cache_control" in p) for p in content
    )


def _function_response(message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A tool message as a `functionResponse` part: its text as `{"result": text}`, named after
    the call it answers."""
    call_id = str(message.get("tool_call_id") or "")
    name = names.get(call_id) or message.get("name") or "tool"
    response = {"name": name, "response": {"result": _text(message.get("content"))}}
    return {"functionResponse": response | ({"id": call_id} if call_id else {})}


def _parts(message: dict[str, Any], names: dict[str, str], i: int) -> list[dict[str, Any]]:
    """A message's content as Gemini parts: text blocks as text, images given as data as inline
    data, Gemini's own parts unchanged, an assistant's tool calls as `functionCall`."""
    content = message.get("content")
    parts: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            parts.append({"text": content})
    elif isinstance(content, list):
        for j, block in enumerate(content):
            if not isinstance(block, dict) or "type" not in block:  # a Gemini part as a Gemini line gave it
                parts.append(block)
            elif block.get("type") in ("text", "input_text", "output_text"):
                parts.append({"text": str(block.get("text") or "")})
            elif block.get("type") == "image_url":
                parts.append(_inline_image(block, f"messages[{i}].content[{j}]"))
            else:
                raise Untranslatable(f"messages[{i}].content[{j}].type", PROVIDER, f"has no {block.get('type')!r} part")
    for k, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        names[str(call.get("id") or "")] = str(function.get("name") or "")
        where = f"messages[{i}].tool_calls[{k}].function.arguments"
        args = arguments_object(function.get("arguments"), where, PROVIDER)
        call_id = call.get("id")
        parts.append(
            {"functionCall": {"name": function.get("name"), "args": args} | ({"id": call_id} if call_id else {})}
        )
    return parts


def _inline_image(block: dict[str, Any], where: str) -> dict[str, Any]:
    image = block.get("image_url")
    url = str(image.get("url") if isinstance(image, dict) else image)
    inline = data_url(url)
    if inline is None:
        raise Untranslatable(f"{where}.image_url", PROVIDER, "takes images only as data (a data: URL), not by URL")
    return {"inlineData": {"mimeType": inline[0], "data": inline[1]}}


def _generation_config(
    params: dict[str, Any], response_format: dict[str, Any] | None, dropped: list[str] | None = None
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name, value in params.items():
        if name in _TO_CONFIG and value is not None:
            key = _TO_CONFIG[name]
            config[key] = [value] if key == "stopSequences" and isinstance(value, str) else value
        elif name in _NATIVE_CONFIG:
            config[name] = value
        elif dropped is not None and name not in _NOT_CONFIG:
            dropped.append(name)
    limit = output_limit(params)
    if limit is not None:
        config["maxOutputTokens"] = limit
        if dropped is not None:
            dropped.extend(spare_limits(params))
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_schema":
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = response_format.get("json_schema", {}).get("schema", {"type": "object"})
        elif kind == "json_object":
            config["responseMimeType"] = "application/json"
        elif "properties" in response_format or kind in ("object", "array"):  # a bare schema
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = response_format
    return config


def _tools(tools: Any) -> list[dict[str, Any]]:
    """OpenAI's and Anthropic's function tools as one Gemini `functionDeclarations` tool; Gemini's
    own tools (`functionDeclarations`, `googleSearch`, ...) unchanged; any other kind refused."""
    if not isinstance(tools, list):
        return []
    declarations: list[dict[str, Any]] = []
    native: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            spec = tool["function"]
        elif "input_schema" in tool and "name" in tool:  # Anthropic's shape
            spec = {"name": tool["name"], "description": tool.get("description"), "parameters": tool["input_schema"]}
        elif "type" in tool:
            raise Untranslatable(f"params.tools[{i}].type", PROVIDER, f"has no {tool['type']!r} tool")
        else:
            native.append(tool)
            continue
        declaration = {"name": spec.get("name"), "description": spec.get("description") or ""}
        if spec.get("parameters") is not None:
            declaration["parametersJsonSchema"] = spec["parameters"]
        declarations.append(declaration)
    return ([{"functionDeclarations": declarations}] if declarations else []) + native


def _tool_config(choice: Any) -> dict[str, Any]:
    """OpenAI's or Anthropic's `tool_choice` as Gemini's `toolConfig.functionCallingConfig`."""
    if isinstance(choice, str) and choice in _MODES:
        return {"functionCallingConfig": {"mode": _MODES[choice]}}
    if isinstance(choice, dict):
        kind = choice.get("type")
        name = (choice.get("function") or {}).get("name") if kind == "function" else choice.get("name")
        if kind in ("function", "tool") and name:
            return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
        if kind in _MODES:
            return {"functionCallingConfig": {"mode": _MODES[kind]}}
    raise Untranslatable("params.tool_choice", PROVIDER, f"has no tool choice {choice!r}")


# -- a Gemini batch-input line, read at enqueue ----------------------------------------------


def camel_fields(request: dict[str, Any]) -> dict[str, Any]:
    """A request's field names in lowerCamelCase, as Gemini reads them: its JSON takes a field's
    proto name too (`max_output_tokens`; `google-genai` sends some so). Field names only: a JSON
    schema's property names, a function call's arguments are left as they are."""
    out = _keys(request)
    config = _keys(out.get("generationConfig") or {})
    if isinstance(config.get("thinkingConfig"), dict):
        config["thinkingConfig"] = _keys(config["thinkingConfig"])
    out["generationConfig"] = config
    if isinstance(out.get("tools"), list):
        out["tools"] = [
            _keys(tool) | {"functionDeclarations": [_keys(d) for d in _keys(tool).get("functionDeclarations") or []]}
            if "functionDeclarations" in _keys(tool)
            else tool
            for tool in out["tools"]
        ]
    if isinstance(out.get("contents"), list):
        out["contents"] = [
            _keys(c) | {"parts": [_keys(p) if isinstance(p, dict) else p for p in _keys(c).get("parts") or []]}
            if isinstance(c, dict) and isinstance(c.get("parts"), list)
            else c
            for c in out["contents"]
        ]
    return out


def _keys(obj: Any) -> dict[str, Any]:
    return {_camel_name(k): v for k, v in obj.items()} if isinstance(obj, dict) else {}


def _camel_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def ledger_fields(request: dict[str, Any]) -> dict[str, Any]:
    """A `GenerateContentRequest` (a Gemini batch line's `request`) as the ledger's request fields:
    `messages`, `system`, `params`, `response_format` (and `model` when the request names one)."""
    request = camel_fields(request)
    contents = request.get("contents")
    if not isinstance(contents, list):
        raise ValueError("request.contents must be a list of contents")
    messages: list[dict[str, Any]] = []
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
            raise ValueError(f"request.contents[{i}] must be an object with a list of parts")
        role = "assistant" if content.get("role") == "model" else "user"
        parts = content["parts"]
        plain = all(isinstance(p, dict) and set(p) == {"text"} for p in parts)
        messages.append({"role": role, "content": "".join(p["text"] for p in parts) if plain else parts})
    fields: dict[str, Any] = {"messages": messages}
    instruction = request.get("systemInstruction")
    if isinstance(instruction, dict):
        fields["system"] = _text(instruction.get("parts")) or None
    elif isinstance(instruction, str):
        fields["system"] = instruction or None
    params: dict[str, Any] = {}
    config = request.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise ValueError("request.generationConfig must be an object")
    response_format: dict[str, Any] | None = None
    schema = next((config[k] for k in _SCHEMA_KEYS if k in config), None)
    if schema is not None:
        response_format = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    elif config.get("responseMimeType") == "application/json":
        response_format = {"type": "json_object"}
    for key, value in config.items():
        if key in _FROM_CONFIG:
            params[_FROM_CONFIG[key]] = value
        elif key not in (*_SCHEMA_KEYS, "responseMimeType"):
            params[key] = value  # Gemini's own knob, under its own name
    for key in (*_NATIVE_REQUEST, "tools"):
        if key in request:
            params[key] = request[key]
    fields["params"] = params
    fields["response_format"] = response_format
    if isinstance(request.get("model"), str):
        fields["model"] = request["model"].removeprefix("models/")
    return fields


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and not p.get("thought"))
    return ""


# -- an answer, read whole ---------------------------------------------------------------------

# `finishReason`, in the ledger's words (anything else is `other`).
_FINISH = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "LANGUAGE": "content_filter",
}


def content_result(body: Any, status_code: int = 200, body_text: str | None = None) -> CallResult:
    """A `GenerateContentResponse`, whole (online and in batches): the first candidate's text parts
    joined, its thought parts as thinking, `functionCall` parts as tool calls; a prompt blocked
    before any candidate is a content filter's answer. Input counts every prompt token (cached
    ones among them); output counts the answer's and the thoughts' tokens, as Gemini bills both."""
    if not isinstance(body, dict):
        body = {}
    candidates = body.get("candidates") or []
    candidate = candidates[0] if candidates and isinstance(candidates[0], dict) else {}
    texts, thoughts, calls = _candidate_parts(candidate)
    finish, said = _finish(body, candidate, calls)
    prompt, output, cached, thought_tokens = _usage(body.get("usageMetadata") or {})
    return CallResult(
        "".join(texts),
        prompt,
        output,
        status_code,
        finish_reason=finish,
        provider_finish_reason=said if isinstance(said, str) else None,
        tool_calls=tuple(calls),
        thinking=joined(thoughts),
        cached_input_tokens=cached,
        reasoning_tokens=thought_tokens,
        response=body,
        response_text=body_text,
    )


def _candidate_parts(candidate: dict[str, Any]) -> tuple[list[str], list[str], list[ToolCall]]:
    """(text parts, thought parts, function calls) of a candidate's content."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for i, part in enumerate((candidate.get("content") or {}).get("parts") or []):
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            call_id = str(call.get("id") or f"call_{i}")
            calls.append(ToolCall(call_id, str(call.get("name") or ""), answer_arguments(call.get("args") or {})))
        elif part.get("thought"):
            thoughts.append(str(part.get("text") or ""))
        elif "text" in part:
            texts.append(str(part.get("text") or ""))
    return texts, thoughts, calls


def _finish(body: dict[str, Any], candidate: dict[str, Any], calls: list[ToolCall]) -> tuple[str | None, Any]:
    """(why the answer ended in the ledger's words, Gemini's own word): the candidate's
    `finishReason`, or the prompt's `blockReason` when no candidate came."""
    said = candidate.get("finishReason")
    blocked = (body.get("promptFeedback") or {}).get("blockReason")
    if not body.get("candidates") and isinstance(blocked, str):
        return "content_filter", blocked
    if calls and said in (None, "STOP"):
        return "tool_calls", said
    return finish_reason(said, _FINISH) or ("stop" if candidate else None), said


def _usage(usage: dict[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    """(input, output, cached input, thought) tokens of `usageMetadata`: input with the tool-use
    prompt's, output with the thoughts'."""
    prompt = token_count(usage.get("promptTokenCount"))
    tool_prompt = token_count(usage.get("toolUsePromptTokenCount")) or 0
    answer = token_count(usage.get("candidatesTokenCount"))
    # Gemini leaves a count out when it is 0: with a prompt counted, none said is none spent.
    none = 0 if prompt is not None else None
    thought_tokens = token_count(usage.get("thoughtsTokenCount")) or none
    cached = token_count(usage.get("cachedContentTokenCount")) or none
    output = None if answer is None and thought_tokens is None else (answer or 0) + (thought_tokens or 0)
    return None if prompt is None else prompt + tool_prompt, output, cached, thought_tokens
