"""What each adapter derives from a provider's body (pure), and what the answer costs.

The bodies are the providers' documented shapes; each field is checked on its own, so a
provider change that drops one shows as that field's failure.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from adapters.anthropic import message_result
from adapters.base import CallRequest, response_text
from adapters.errors import ProviderError
from adapters.openai import completion_result
from adapters.openai_responses import responses_body, responses_result, text_format
from ledger.parsing import parse_verdict
from ledger.prices import Price, PriceTableError, _read


def chat(message: dict[str, Any], finish: str = "stop", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5},
    }


def test_a_chat_tool_call_keeps_its_calls_and_has_no_text() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    body = chat({"content": None, "tool_calls": [call]}, "tool_calls")
    answer = completion_result(body)
    assert answer.text == ""
    assert answer.finish_reason == "tool_calls" and answer.provider_finish_reason == "tool_calls"
    assert [c.as_json() for c in answer.tool_calls] == [
        {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}  # the exact text, spaces and all
    ]
    assert answer.response is body


def test_a_chat_refusal_a_cut_off_and_reasoning_content() -> None:
    refused = completion_result(chat({"content": None, "refusal": "I can't help with that."}))
    assert (refused.text, refused.refusal, refused.finish_reason) == ("", "I can't help with that.", "refusal")
    cut = completion_result(chat({"content": "Partly thro"}, "length"))
    assert (cut.finish_reason, cut.provider_finish_reason) == ("length", "length")
    thought = completion_result(chat({"content": "VERDICT: 3", "reasoning_content": "Hmm. VERDICT: 1"}))
    assert thought.thinking == "Hmm. VERDICT: 1" and thought.text == "VERDICT: 3"
    filtered = completion_result(chat({"content": ""}, "content_filter"))
    assert filtered.finish_reason == "content_filter"
    odd = completion_result(chat({"content": "x"}, "eos"))
    assert (odd.finish_reason, odd.provider_finish_reason) == ("other", "eos")


def test_chat_usage_in_full() -> None:
    usage = {
        "prompt_tokens": 2000,
        "completion_tokens": 300,
        "prompt_tokens_details": {"cached_tokens": 1536},
        "completion_tokens_details": {"reasoning_tokens": 192},
    }
    answer = completion_result(chat({"content": "ok"}, usage=usage))
    assert (answer.input_tokens, answer.cached_input_tokens, answer.cache_write_tokens) == (2000, 1536, None)
    assert (answer.output_tokens, answer.reasoning_tokens) == (300, 192)


def test_a_chat_body_without_a_message_is_malformed() -> None:
    with pytest.raises(ProviderError, match="no choices"):
        completion_result({"choices": []})
    with pytest.raises(ProviderError, match="content"):
        completion_result({"choices": [{"message": {"role": "assistant"}}]})


def test_a_responses_answer_its_text_calls_reasoning_and_usage() -> None:
    body = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Weighing it."}]},
            {"type": "message", "content": [{"type": "output_text", "text": "Part one. "}]},
            {"type": "message", "content": [{"type": "output_text", "text": "VERDICT: 4"}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "lookup", "arguments": '{"q":"x"}'},
        ],
        "usage": {
            "input_tokens": 900,
            "input_tokens_details": {"cached_tokens": 512},
            "output_tokens": 120,
            "output_tokens_details": {"reasoning_tokens": 64},
        },
    }
    answer = responses_result(body)
    assert answer.text == "Part one. VERDICT: 4"  # output_text parts joined
    assert answer.thinking == "Weighing it."
    assert [c.as_json() for c in answer.tool_calls] == [{"id": "call_9", "name": "lookup", "arguments": '{"q":"x"}'}]
    assert answer.finish_reason == "tool_calls"
    assert (answer.input_tokens, answer.cached_input_tokens, answer.output_tokens, answer.reasoning_tokens) == (
        900,
        512,
        120,
        64,
    )


def test_an_incomplete_response_is_a_cut_off_and_a_refusal_is_one() -> None:
    cut = responses_result(
        {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": [], "usage": {}}
    )
    assert (cut.finish_reason, cut.provider_finish_reason) == ("length", "max_output_tokens")
    refused = responses_result(
        {"status": "completed", "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "No."}]}]}
    )
    assert (refused.text, refused.refusal, refused.finish_reason) == ("", "No.", "refusal")


def test_a_stored_request_becomes_a_responses_body() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "integer"}}}
    request = CallRequest(
        model="gpt-4.1-mini",
        messages=[{"role": "user", "content": "Hi"}],
        system="Be brief.",
        params={"max_output_tokens": 50, "text": {"verbosity": "low"}},
        response_format={"type": "json_schema", "json_schema": {"name": "g", "schema": schema, "strict": True}},
        api="responses",
    )
    assert responses_body(request) == {
        "model": "gpt-4.1-mini",
        "input": [{"role": "user", "content": "Hi"}],
        "instructions": "Be brief.",
        "max_output_tokens": 50,
        "text": {"verbosity": "low", "format": {"type": "json_schema", "name": "g", "schema": schema, "strict": True}},
    }
    assert text_format({"type": "json_object"}) == {"type": "json_object"}


def test_anthropic_thinking_never_reaches_the_text_nor_the_verdict() -> None:
    body = {
        "type": "message",
        "content": [
            {"type": "thinking", "thinking": "First thought: VERDICT: 1", "signature": "s"},
            {"type": "text", "text": "The design holds.\nVERDICT: 4"},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 50, "output_tokens": 80},
    }
    answer = message_result(body)
    assert answer.thinking == "First thought: VERDICT: 1"
    assert answer.text == "The design holds.\nVERDICT: 4"
    assert parse_verdict(answer.text).score == 4


def test_anthropic_tool_use_is_serialised_with_sorted_keys_and_usage_counts_the_cache() -> None:
    body = {
        "type": "message",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"unit": "c", "city": "Paris"}},
        ],
        "stop_reason": "tool_use",
        "usage": {
            "input_tokens": 20,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 300,
            "output_tokens": 40,
        },
    }
    answer = message_result(body)
    assert answer.text == "Let me look."
    assert [c.as_json() for c in answer.tool_calls] == [
        {"id": "toolu_1", "name": "get_weather", "arguments": '{"city":"Paris","unit":"c"}'}
    ]
    assert json.loads(answer.tool_calls[0].arguments) == {"unit": "c", "city": "Paris"}
    assert answer.finish_reason == "tool_calls" and answer.provider_finish_reason == "tool_use"
    assert (answer.input_tokens, answer.cached_input_tokens, answer.cache_write_tokens) == (1320, 1000, 300)
    cut = message_result({"content": [{"type": "text", "text": "x"}], "stop_reason": "max_tokens", "usage": {}})
    assert cut.finish_reason == "length" and cut.input_tokens is None
    refused = message_result({"content": [{"type": "text", "text": "No."}], "stop_reason": "refusal"})
    assert (refused.refusal, refused.finish_reason) == ("No.", "refusal")


def test_cost_prices_every_kind_of_token_at_its_own_rate() -> None:
    price = Price(input=3.0, output=15.0, batch_discount=0.5, cached_input=0.3, cache_write=3.75)
    # 1320 input = 20 uncached + 1000 cached + 300 written; 40 output.
    usd = (20 * 3.0 + 1000 * 0.3 + 300 * 3.75 + 40 * 15.0) / 1e6
    assert price.cost(1320, 40, cached_input_tokens=1000, cache_write_tokens=300) == pytest.approx(usd)
    assert price.cost(1320, 40, cached_input_tokens=1000, cache_write_tokens=300, batch=True) == pytest.approx(usd / 2)
    plain = Price(input=3.0, output=15.0)  # no cache rates: every input token at `input`
    assert plain.cost(1320, 40, cached_input_tokens=1000, cache_write_tokens=300) == pytest.approx(
        (1320 * 3.0 + 40 * 15.0) / 1e6
    )
    # The worst case a budget reserves prices input at the dearest input rate (a cache write).
    assert price.most(1000, 100) == pytest.approx((1000 * 3.75 + 100 * 15.0) / 1e6)


def test_a_price_file_takes_cache_rates_and_names_a_bad_one() -> None:
    prices = _read('[openai.models]\n"m" = { input = 1, output = 2, cached_input = 0.25 }\n', "p.toml")
    assert prices[("openai", "m")] == Price(1.0, 2.0, 0.0, 0.25, None)
    with pytest.raises(PriceTableError, match=r"^p\.toml: openai\.models\.'m'\.cache_write must be a number >= 0"):
        _read('[openai.models]\n"m" = { input = 1, output = 2, cache_write = "x" }\n', "p.toml")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", '{"content": "café \u2014 ok"}'.encode()),
        (None, '{"content": "café"}'.encode()),
        ("application/json; charset=iso-8859-1", '{"content": "café"}'.encode("latin-1")),
        ("application/json", b'{"content": "bad \xff byte"}'),
    ],
)
def test_an_answers_body_reads_as_the_text_httpx_would_give(content_type: str | None, body: bytes) -> None:
    """The body an answer keeps (`response_text`) is the text httpx decodes, whether the server
    names a charset or not, a byte that is not UTF-8 included."""
    headers = {"content-type": content_type} if content_type else {}
    assert response_text(httpx2.Response(200, headers=headers, content=body)) == (
        httpx2.Response(200, headers=headers, content=body).text
    )
