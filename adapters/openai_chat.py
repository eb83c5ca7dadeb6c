"""OpenAI's chat completions wire format, written with no SDK import: the body of a stored
request, for online calls and batch lines alike (`chat_body`), and the check enqueue makes.

A chat line is stored as given, so written back for OpenAI it is the same request. A request in
Anthropic's or Gemini's words is translated here (their blocks and parts by
`anthropic_blocks.chat_conversation` and `gemini_parts.chat_conversation`; their tools and tool
choices below). OpenAI and Azure get only the parameters OpenAI's `CompletionCreateParams` has
(the others are left out and named) and the output limit as `max_completion_tokens`, never beside
`max_tokens`; an OpenAI-compatible server gets every parameter as given (servers differ), its
output limit under the caller's name.
"""

from __future__ import annotations

from typing import Any, Final

from adapters.anthropic_blocks import chat_conversation as anthropic_chat
from adapters.base import CallRequest
from adapters.gemini_parts import chat_conversation as gemini_chat
from adapters.token_limit import OUTPUT_LIMIT_NAMES
from adapters.translation import Untranslatable

# `CompletionCreateParams` of the pinned openai SDK (3.57) besides model and messages: what the
# API takes (tests/unit/test_wire_translation.py checks it against the SDK).
CHAT_PARAMS: Final = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "metadata",
        "modalities",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
ENDPOINT: Final = "/v1/chat/completions"
# Body keys of a chat line that are not parameters (`metadata` is kept as the request's trace).
_NOT_PARAMS = frozenset({"model", "messages", "system", "response_format", "metadata", "stream", "stream_options"})
# Providers whose API is OpenAI's own: only its parameters are sent.
_OPENAI_ITSELF = frozenset({"openai", "azure"})
# Other providers' parameters that chat says otherwise.
_TRANSLATED = frozenset({"stop_sequences", "toolConfig"})
# Params a chat request sends as given (the output limit renamed at most), no look at their values.
_PLAIN = (CHAT_PARAMS - {"tools", "tool_choice"}) | {"max_tokens", "max_output_tokens"}
_GEMINI_MODES = {"AUTO": "auto", "NONE": "none", "ANY": "required"}


def line_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body's request fields, as given: messages, parameters, response format (and a
    `system` key, which some callers add beside the messages)."""
    if "messages" not in body:
        raise ValueError("missing 'messages'")
    return {
        "messages": body["messages"],
        "system": body.get("system") or None,
        "params": {k: v for k, v in body.items() if k not in _NOT_PARAMS},
        "response_format": body.get("response_format"),
    }


def openai_messages(request: CallRequest, provider: str = "openai", dropped: list[str] | None = None) -> list[Any]:
    """The request's conversation as chat messages: the system text first, then the messages
    (as given when they are chat's own; Anthropic's blocks and Gemini's parts translated)."""
    system, messages = request.system, request.messages
    for message in messages:  # only a list of parts can be in another API's words
        if type(message.get("content")) is list:
            system, messages = _in_chat_words(system, messages, provider, dropped)
            break
    else:
        if type(system) is list:
            system, messages = _in_chat_words(system, messages, provider, dropped)
    if not system:
        return messages
    return [{"role": "system", "content": system}, *messages]


def _in_chat_words(
    system: Any, messages: list[dict[str, Any]], provider: str, dropped: list[str] | None
) -> tuple[Any, list[dict[str, Any]]]:
    system, messages = anthropic_chat(system, messages, provider, dropped)
    return system, gemini_chat(messages, provider, dropped)


def chat_body(request: CallRequest, provider: str = "openai", dropped: list[str] | None = None) -> dict[str, Any]:
    """The chat completions body of a stored request (online calls and batch lines alike);
    `dropped` collects the names of what is left out. `Untranslatable` for what chat cannot say."""
    params = request.params
    body: dict[str, Any] = {"model": request.model, "messages": openai_messages(request, provider, dropped), **params}
    if not _PLAIN.issuperset(params):  # another API's words, or what OpenAI does not take
        _other_params(params, body, provider in _OPENAI_ITSELF, dropped)
    if "max_tokens" in params or "max_output_tokens" in params:  # a limit under another name than OpenAI's
        if "max_completion_tokens" in params or "max_output_tokens" in params or provider not in _OPENAI_ITSELF:
            _one_limit(params, body, provider in _OPENAI_ITSELF, dropped)
        else:  # the usual: max_tokens alone
            body["max_completion_tokens"] = body.pop("max_tokens")
    if request.response_format is not None:
        body["response_format"] = chat_response_format(request.response_format)
    return body


def _other_params(params: dict[str, Any], body: dict[str, Any], known_only: bool, dropped: list[str] | None) -> None:
    """Other APIs' ways of saying chat's parameters (`stop_sequences`, tools, tool choices); the
    parameters OpenAI does not take left out (a compatible server gets them as given)."""
    for name in params:
        if name in _PLAIN or name in ("tools", "tool_choice"):
            continue
        if name in _TRANSLATED or known_only:
            del body[name]
            if dropped is not None and name not in _TRANSLATED:
                dropped.append(name)
    if "stop_sequences" in params and "stop" not in params:
        body["stop"] = params["stop_sequences"]
    if "tools" in params:
        body["tools"] = [tool for i, tool in enumerate(params["tools"] or []) for tool in _tools(tool, i)]
    if "tool_choice" in params:
        body["tool_choice"] = _tool_choice(params["tool_choice"])
    elif "toolConfig" in params:
        body["tool_choice"] = _gemini_choice(params["toolConfig"])


def _one_limit(params: dict[str, Any], body: dict[str, Any], known_only: bool, dropped: list[str] | None) -> None:
    """One output limit on the wire, the first given in `OUTPUT_LIMIT_NAMES`' order: under OpenAI's
    own name for OpenAI and Azure, the caller's for a compatible server; the others left out."""
    first = True
    for name in OUTPUT_LIMIT_NAMES:
        value = body.pop(name, None)
        if not value:
            continue
        if first:
            body["max_completion_tokens" if known_only else name] = value
            first = False
        elif dropped is not None:
            dropped.append(name)


def check(request: CallRequest, provider: str = "openai") -> list[str]:
    """What enqueue asks: the parameters left out of the request's body (`Untranslatable` raised)."""
    dropped: list[str] = []
    chat_body(request, provider, dropped)
    return dropped


def chat_response_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """A stored response format as chat's (a bare JSON schema wrapped as `json_schema`)."""
    if response_format.get("type") in ("json_schema", "json_object", "text"):
        return response_format
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": response_format}}


def _tools(tool: Any, i: int) -> list[dict[str, Any]]:
    """One tool as chat's function tools: OpenAI's as given, Anthropic's `input_schema` tool, each
    of Gemini's function declarations."""
    if not isinstance(tool, dict):
        raise Untranslatable(f"params.tools[{i}]", "openai", "takes tools only as objects")
    if tool.get("type") in ("function", "custom"):
        return [tool]
    if "input_schema" in tool and "name" in tool:
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        return [{"type": "function", "function": function}]
    if isinstance(tool.get("functionDeclarations"), list):
        return [_declaration(d) for d in tool["functionDeclarations"] if isinstance(d, dict)]
    kind = tool.get("type") or next(iter(tool), "")
    raise Untranslatable(f"params.tools[{i}]", "openai", f"has no {kind!r} tool in chat completions")


def _declaration(declaration: dict[str, Any]) -> dict[str, Any]:
    function = {"name": declaration.get("name")}
    if declaration.get("description"):
        function["description"] = declaration["description"]
    schema = declaration.get("parametersJsonSchema") or declaration.get("parameters")
    if schema is not None:
        function["parameters"] = schema
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    """Anthropic's `tool_choice` objects as chat's; chat's own as given."""
    if not isinstance(choice, dict) or choice.get("type") == "function":
        return choice
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind in ("auto", "none", "any"):
        return "required" if kind == "any" else kind
    raise Untranslatable("params.tool_choice", "openai", f"has no tool choice {kind!r}")


def _gemini_choice(config: Any) -> Any:
    calling = (config or {}).get("functionCallingConfig") or {}
    mode = str(calling.get("mode") or "AUTO").upper()
    names = calling.get("allowedFunctionNames") or []
    if mode == "ANY" and len(names) == 1:
        return {"type": "function", "function": {"name": names[0]}}
    if mode in _GEMINI_MODES and not names:
        return _GEMINI_MODES[mode]
    raise Untranslatable("params.toolConfig", "openai", f"has no tool choice like Gemini's mode {mode} {names}")
