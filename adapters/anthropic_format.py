"""Anthropic's Messages wire format, both ways, with no SDK import: enqueue reads Messages bodies
with it (`line_fields`), the online and batch adapters write requests with it (`messages_body`),
and `anthropic_blocks` reads Anthropic's blocks for the other providers' writers.

A Messages line is stored as given: its messages (blocks, `cache_control` marks, `tool_use` and
`tool_result` blocks), its system (a string or a list of blocks), its parameters; only a JSON
schema in `output_config.format` moves to the ledger's `response_format` (chat's shape, which every
stage reads). Written back for Anthropic it is the same request. A request written in OpenAI's or
Gemini's words is translated here: system and developer messages to `system`, `tool_calls` to
`tool_use` blocks, `tool` messages to `tool_result` blocks, images to image blocks, function tools
to `input_schema` tools, `tool_choice` to its objects, a JSON schema to `output_config.format`.
Parameters the API does not take (its `MessageCreateParams` in the pinned SDK has no
`temperature`, `top_p` or `top_k`) are left out and named.
"""

from __future__ import annotations

from typing import Any, Final

from adapters.anthropic_blocks import BLOCK_TYPES
from adapters.base import CallRequest
from adapters.gemini_parts import chat_conversation as gemini_chat
from adapters.token_limit import OUTPUT_LIMIT_NAMES, output_limit, spare_limits
from adapters.translation import Untranslatable, arguments_object, data_url

PROVIDER: Final = "anthropic"
DEFAULT_MAX_TOKENS: Final = 1024
# `MessageCreateParams` of the pinned anthropic SDK (2.14) besides model, messages and system:
# what the API takes (tests/unit/test_wire_translation.py checks it against the SDK).
MESSAGES_PARAMS: Final = frozenset(
    {
        "cache_control",
        "container",
        "diagnostics",
        "inference_geo",
        "max_tokens",
        "metadata",
        "output_config",
        "service_tier",
        "speed",
        "stop_sequences",
        "thinking",
        "tool_choice",
        "tools",
        "user_profile_id",
        "workspace_id",
    }
)
# Body keys of a Messages line that are not parameters.
_NOT_PARAMS = frozenset({"model", "messages", "system", "metadata", "stream"})
# Parameters sent as given, and those said otherwise in other APIs' words (translated).
_AS_GIVEN = MESSAGES_PARAMS - {"tools", "tool_choice", "max_tokens"}
_TRANSLATED = frozenset({"stop", "tools", "tool_choice", "toolConfig", "parallel_tool_calls"})
_CHOICES = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}


# -- a Messages body, read at enqueue --------------------------------------------------------


def line_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages body's request fields: messages and system as given, the parameters, and a JSON
    schema in `output_config.format` as the response format (the rest of `output_config` stays)."""
    if "messages" not in body:
        raise ValueError("missing 'messages'")
    params = {k: v for k, v in body.items() if k not in _NOT_PARAMS}
    response_format = None
    config = params.get("output_config")
    if isinstance(config, dict) and isinstance(config.get("format"), dict):
        given = config["format"]
        if given.get("type") == "json_schema" and isinstance(given.get("schema"), dict):
            response_format = {"type": "json_schema", "json_schema": {"name": "response", "schema": given["schema"]}}
            rest = {k: v for k, v in config.items() if k != "format"}
            if rest:
                params["output_config"] = rest
            else:
                del params["output_config"]
    system = body.get("system")
    return {
        "messages": body.get("messages"),
        "system": system or None,
        "params": params,
        "response_format": response_format,
    }


# -- a request written as a Messages body ----------------------------------------------------


def messages_body(request: CallRequest, dropped: list[str] | None = None) -> dict[str, Any]:
    """The Messages body of a stored request (online calls and batch entries alike); `dropped`
    collects the names of what is left out. `Untranslatable` for what the API cannot express."""
    system, messages = request.system, request.messages
    for message in messages:  # plain text turns are Anthropic's words already: sent as they are
        if type(message.get("content")) is not str or len(message) != 2 or message.get("role") not in _TURNS:
            system, messages = _conversation(system, messages, dropped)
            break
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if system:
        body["system"] = system
    _params(request.params, request.response_format, body, dropped)
    return body


def check(request: CallRequest) -> list[str]:
    """What enqueue asks: the parameters left out of the request's body (`Untranslatable` raised)."""
    dropped: list[str] = []
    messages_body(request, dropped)
    return dropped


def _conversation(
    system: Any, messages: list[dict[str, Any]], dropped: list[str] | None
) -> tuple[Any, list[dict[str, Any]]]:
    if any(_gemini_shaped(m) for m in messages):
        messages = gemini_chat(messages, PROVIDER, dropped)
    systems: list[Any] = [system] if system else []
    out: list[dict[str, Any]] = []
    results_turn: dict[str, Any] | None = None  # the user turn holding the latest tool results
    for i, message in enumerate(messages):
        role = message.get("role")
        if results_turn is None and type(message.get("content")) is str and len(message) == 2 and role in _TURNS:
            out.append(message)  # plain text: Anthropic's words too
            continue
        if role in ("system", "developer"):
            systems.append(message.get("content"))
            continue
        if role == "tool":
            block = _tool_result(message, f"messages[{i}]")
            if results_turn is None:
                results_turn = {"role": "user", "content": []}
                out.append(results_turn)
            results_turn["content"].append(block)
            continue
        if role not in _TURNS:
            raise Untranslatable(f"messages[{i}].role", PROVIDER, f"has no role {role!r}")
        converted = _message(message, i, dropped)
        if results_turn is not None and role == "user":  # text after tool results: the same turn
            results_turn["content"].extend(_blocks(converted["content"]))
        else:
            out.append(converted)
        results_turn = None
    return _system(systems, dropped), out


def _gemini_shaped(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return type(content) is list and any(isinstance(p, dict) and "type" not in p for p in content)


_TURNS = ("user", "assistant")


def _system(systems: list[Any], dropped: list[str] | None) -> Any:
    """One system: a string as given (or several joined), or blocks as given when any is a list."""
    if not systems:
        return None
    if len(systems) == 1 and isinstance(systems[0], str | list):
        return systems[0]
    if all(isinstance(s, str) for s in systems):
        return "\n\n".join(systems)
    return [block for s in systems for block in _blocks(s)]


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or [])


def _message(message: dict[str, Any], i: int, dropped: list[str] | None) -> dict[str, Any]:
    """A user or assistant message in Anthropic's words (as given when it already is)."""
    extra = set(message) - {"role", "content", "tool_calls"}
    if "name" in extra:
        raise Untranslatable(f"messages[{i}].name", PROVIDER, "has no name for a message's author")
    if extra:
        raise Untranslatable(f"messages[{i}].{sorted(extra)[0]}", PROVIDER, "has no such message field")
    content = message.get("content")
    calls = message.get("tool_calls")
    if type(content) is str and not calls:
        return message if len(message) == 2 else {"role": message["role"], "content": content}
    blocks = [_block(part, f"messages[{i}].content[{j}]") for j, part in enumerate(_blocks(content))]
    for k, call in enumerate(calls or []):
        blocks.append(_tool_use(call, f"messages[{i}].tool_calls[{k}]"))
    return {"role": message["role"], "content": blocks}


def _block(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise Untranslatable(where, PROVIDER, "takes content blocks only as objects")
    kind = part.get("type")
    if kind == "text" or kind in BLOCK_TYPES:
        return part
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        inline = data_url(str(url))
        if inline is not None:
            return {"type": "image", "source": {"type": "base64", "media_type": inline[0], "data": inline[1]}}
        return {"type": "image", "source": {"type": "url", "url": str(url)}}
    raise Untranslatable(f"{where}.type", PROVIDER, f"has no {kind!r} content part")


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise Untranslatable(where, PROVIDER, "takes only function tool calls")
    arguments = arguments_object(function.get("arguments"), f"{where}.function.arguments", PROVIDER)
    return {"type": "tool_use", "id": str(call.get("id") or ""), "name": str(function.get("name")), "input": arguments}


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    if not message.get("tool_call_id"):
        raise Untranslatable(f"{where}.tool_call_id", PROVIDER, "needs the id of the tool call a result answers")
    content = message.get("content")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(message["tool_call_id"])}
    if isinstance(content, str):
        block["content"] = content
    elif isinstance(content, list):
        block["content"] = [_block(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
    return block


def _params(
    params: dict[str, Any], response_format: dict[str, Any] | None, body: dict[str, Any], dropped: list[str] | None
) -> None:
    translated = False
    for name, value in params.items():
        if name in _AS_GIVEN:
            body[name] = value
        elif name in _TRANSLATED:
            translated = True
        elif name not in OUTPUT_LIMIT_NAMES and dropped is not None:
            dropped.append(name)
    if translated:
        _translated(params, body)
    body["max_tokens"] = int(output_limit(params) or DEFAULT_MAX_TOKENS)
    if dropped is not None:
        dropped.extend(spare_limits(params))
    if response_format is not None:
        found = output_format(response_format)
        if found is not None:
            body["output_config"] = {**(body.get("output_config") or {}), "format": found}


def _translated(params: dict[str, Any], body: dict[str, Any]) -> None:
    """OpenAI's and Gemini's ways of saying Anthropic's parameters: `stop`, function tools, tool
    choices, `parallel_tool_calls: false`."""
    if "stop" in params and "stop_sequences" not in params:
        stop = params["stop"]
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if "tools" in params:
        tools = params["tools"] or []
        body["tools"] = [one for i, tool in enumerate(tools) for one in _tools(tool, f"params.tools[{i}]")]
    if "tool_choice" in params:
        body["tool_choice"] = _tool_choice(params["tool_choice"])
    elif "toolConfig" in params:
        body["tool_choice"] = _gemini_choice(params["toolConfig"])
    if params.get("parallel_tool_calls") is False:
        body["tool_choice"] = {**body.get("tool_choice", {"type": "auto"}), "disable_parallel_tool_use": True}


def output_format(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """A stored response format as `output_config.format` (None for plain text)."""
    kind = response_format.get("type")
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return {"type": "json_schema", "schema": schema if isinstance(schema, dict) else {"type": "object"}}
    if kind == "text":
        return None
    if kind == "json_object":
        raise Untranslatable("response_format", PROVIDER, "takes structured output only as a JSON schema")
    return {"type": "json_schema", "schema": response_format}  # a bare schema


def _tools(tool: Any, where: str) -> list[dict[str, Any]]:
    """One tool as Anthropic's: OpenAI's function tool, each of Gemini's function declarations
    (`parameters` as `input_schema`), Anthropic's own as given."""
    if not isinstance(tool, dict):
        raise Untranslatable(where, PROVIDER, "takes tools only as objects")
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        spec = tool["function"]
        return [_function_tool(spec.get("name"), spec.get("description"), spec.get("parameters"), spec)]
    if isinstance(tool.get("functionDeclarations"), list):
        return [
            _function_tool(
                d.get("name"), d.get("description"), d.get("parametersJsonSchema") or d.get("parameters"), {}
            )
            for d in tool["functionDeclarations"]
            if isinstance(d, dict)
        ]
    if "input_schema" in tool or str(tool.get("type") or "").startswith(("web_", "bash_", "code_", "text_editor")):
        return [tool]  # Anthropic's own
    kind = tool.get("type") or next(iter(tool), "")
    raise Untranslatable(f"{where}", PROVIDER, f"has no {kind!r} tool")


def _function_tool(name: Any, description: Any, schema: Any, spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "input_schema": schema or {"type": "object"}}
    if description:
        out["description"] = description
    if "strict" in spec:
        out["strict"] = spec["strict"]
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise Untranslatable("params.tool_choice", PROVIDER, f"has no tool_choice {choice!r}")
        return _CHOICES[choice]
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    return choice  # Anthropic's own object


def _gemini_choice(config: Any) -> dict[str, Any]:
    calling = (config or {}).get("functionCallingConfig") or {}
    mode = str(calling.get("mode") or "AUTO").upper()
    names = calling.get("allowedFunctionNames") or []
    if mode == "ANY" and len(names) == 1:
        return {"type": "tool", "name": names[0]}
    if mode in ("AUTO", "ANY", "NONE") and not (mode == "ANY" and names):
        return {"type": mode.lower()}
    raise Untranslatable("params.toolConfig", PROVIDER, f"has no tool choice like Gemini's mode {mode} {names}")
