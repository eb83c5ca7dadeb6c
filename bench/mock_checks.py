"""Micro-benchmark: what the mock provider's request checks cost, per request and per wire.

Every request the mock receives (and every line of a batch) is checked against its provider's
definition before it is answered (`adapters/mock_provider/checks.py`). This times the check of
one typical request of each wire (the `bench.batch_100k` prompt; a tool conversation), in this
process, and for OpenAI's also the `jsonschema` validator alone (what the compiled check saves).

    python -m bench.mock_checks [--repeat 20000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from adapters.mock_provider import checks, openai_spec

PROMPT = "Grade essay number 7 on clarity. " + "lorem ipsum " * 20
SYSTEM = "You are a strict grader. Reason, then end with VERDICT: n."
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "openai chat": (
        "openai",
        {
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
            "max_completion_tokens": 256,
        },
    ),
    "openai chat, tool turns": (
        "openai",
        {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "user", "content": PROMPT},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "found"},
                {"role": "user", "content": "and now?"},
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
        },
    ),
    "openai responses": ("responses", {"model": "gpt-4o-mini", "instructions": SYSTEM, "input": PROMPT}),
    "anthropic": (
        "anthropic",
        {
            "model": "claude-haiku-4-5",
            "max_tokens": 256,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": PROMPT}],
        },
    ),
    "gemini": (
        "gemini",
        {
            "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
            "generationConfig": {"maxOutputTokens": 256},
        },
    ),
}


def per_call_us(check: Callable[[], object], repeat: int) -> float:
    check()
    t0 = time.perf_counter()
    for _ in range(repeat):
        check()
    return (time.perf_counter() - t0) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20000)
    args = parser.parse_args()
    t0 = time.perf_counter()
    checks.warm()
    print(f"compiling every check: {(time.perf_counter() - t0) * 1000:.0f} ms (once per process)")
    for name, (wire, body) in BODIES.items():
        assert checks.check(wire, body) is None, name
        print(f"{name:28} {per_call_us(partial(checks.check, wire, body), args.repeat):7.1f} µs/request")
    chat = BODIES["openai chat"][1]
    alone = openai_spec.validator("CreateChatCompletionRequest")
    slow = per_call_us(lambda: alone.is_valid(chat), max(args.repeat // 20, 100))
    print(f"{'openai chat, jsonschema alone':28} {slow:7.1f} µs/request")


if __name__ == "__main__":
    main()
