"""What Gemini refuses, checked the way its API checks it: a `generateContent` body against the
`google-genai` SDK's own types (`Content`, `Part`, `GenerationConfig`, `Tool`, `ToolConfig`,
`SafetySetting`: pydantic models that refuse fields they do not declare) under the REST body's
top-level fields (those of the API's `GenerateContentRequest`), and the rules the API adds: a
role is `user` or `model`, and a turn of `functionResponse` parts comes right after the turn of
`functionCall` parts it answers.

Field names are taken in either spelling (`generationConfig`, `generation_config`), as the
API's JSON reading of its protocol buffers does; its errors name fields in snake case.
"""

from __future__ import annotations

import re
from typing import Any

import pydantic
from google.genai import types
from pydantic.alias_generators import to_camel

from adapters.mock_provider.openai_checks import Refusal


class GenerateContentBody(pydantic.BaseModel):
    """The body of `models/{model}:generateContent` (and of a batch's request), as the SDK
    writes it for the Gemini API."""

    model_config = pydantic.ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    model: str | None = None  # the path names it; a batch file's request may too
    contents: list[types.Content]
    system_instruction: types.Content | None = None
    generation_config: types.GenerationConfig | None = None
    tools: list[types.Tool] | None = None
    tool_config: types.ToolConfig | None = None
    safety_settings: list[types.SafetySetting] | None = None
    cached_content: str | None = None
    labels: dict[str, str] | None = None
    service_tier: str | None = None
    store: bool | None = None


def warm() -> None:
    """Build the models' validators now (the SDK defers it to their first use)."""
    GenerateContentBody.model_validate({"contents": [{"role": "user", "parts": [{"text": "warm"}]}]})


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def _path(loc: tuple[int | str, ...]) -> str:
    said = ""
    for part in loc:
        said += f"[{part}]" if isinstance(part, int) else f".{_snake(str(part))}"
    return said.lstrip(".")


def check_generate(body: Any) -> Refusal | None:
    """None when Gemini takes `body` as a `generateContent` request; else its refusal."""
    if not isinstance(body, dict):
        return Refusal("Invalid JSON payload received. Expected an object.")
    try:
        GenerateContentBody.model_validate(body)
    except pydantic.ValidationError as exc:
        return _refusal(exc.errors(include_url=False)[0])
    return _turns(body.get("contents") or [])


def _refusal(error: Any) -> Refusal:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
    where, name = _path(loc[:-1]), str(loc[-1]) if loc else ""
    if error["type"] == "extra_forbidden":
        at = f" at '{where}'" if where else ""
        return Refusal(f'Invalid JSON payload received. Unknown name "{name}"{at}: Cannot find field.')
    if error["type"] == "missing":
        return Refusal(f"* GenerateContentRequest.{_path(loc)}: required field is not set")
    return Refusal(f"Invalid value at '{_path(loc)}': {error['msg']}")


def _turns(contents: list[Any]) -> Refusal | None:
    called = False
    for content in contents:
        role = content.get("role")
        if role not in (None, "user", "model"):
            return Refusal("Please use a valid role: user, model.")
        parts = [p for p in content.get("parts") or [] if isinstance(p, dict)]
        answers = any("functionResponse" in p or "function_response" in p for p in parts)
        if answers and not called:
            return Refusal("Please ensure that function response turn comes immediately after a function call turn.")
        called = any("functionCall" in p or "function_call" in p for p in parts)
    return None
