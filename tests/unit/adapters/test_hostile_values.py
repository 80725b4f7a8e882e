"""Values that defeat repr(), str() or json.dumps() end as AdapterErrors, never as crashes.

An int past ``sys.get_int_max_str_digits()`` (4300 digits by default) raises ValueError when
printed; a list nested thousands deep raises RecursionError. Both can arrive in a plain dict
an application hands us, in any field a message quotes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.core.types import ProposedCall
from callgate.producer.adapters import (
    SURFACES,
    AdapterError,
    read_proposals,
    read_stream,
    write_results,
)
from callgate.producer.adapters.base import show
from callgate.worker.mcp.results import normalise_result

from .support import inbound

KNOWN = {"get_weather"}
WEATHER = ProposedCall(call_id="c1", tool_name="get_weather", arguments={"city": "Seoul"})
HUGE = 10**5000


def deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


DEEP = deep(5_000)
HOSTILE = [HUGE, DEEP]
HOSTILE_IDS = ["huge-int", "deep-list"]  # pytest cannot print the values themselves


def code_of(run: Any) -> str:
    with pytest.raises(AdapterError) as caught:
        run()
    return str(caught.value.code)


@pytest.mark.parametrize("value", HOSTILE, ids=HOSTILE_IDS)
def test_show_names_the_type_of_what_it_cannot_print(value: object) -> None:
    assert show(value) == f"<{type(value).__name__}>"


@pytest.mark.parametrize("value", HOSTILE, ids=HOSTILE_IDS)
def test_chat_custom_tool_name_and_call_type(value: object) -> None:
    custom = {"id": "c1", "type": "custom", "custom": {"name": value, "input": "x"}}
    odd_type = {"id": "c1", "type": value, "function": {"name": "get_weather"}}
    for call in (custom, odd_type):
        response = {"finish_reason": "tool_calls", "message": {"tool_calls": [call]}}
        assert code_of(lambda r=response: read_proposals("openai-chat", r, KNOWN)) == (
            "invalid_tool_call_field"
        )


@pytest.mark.parametrize("value", HOSTILE, ids=HOSTILE_IDS)
def test_responses_item_type_name_and_status(value: object) -> None:
    response = inbound("openai-responses", [WEATHER])
    response["output"].insert(0, {"type": value, "call_id": value})
    assert read_proposals("openai-responses", response, KNOWN) == [WEATHER]
    response["output"].append({"type": "custom_tool_call", "call_id": "c9", "name": value})
    assert code_of(lambda: read_proposals("openai-responses", response, KNOWN)) == (
        "invalid_tool_call_field"
    )
    response["status"] = value
    assert code_of(lambda: read_proposals("openai-responses", response, KNOWN)) == (
        "invalid_provider_envelope"
    )


@pytest.mark.parametrize("value", HOSTILE, ids=HOSTILE_IDS)
def test_write_results_status(value: object) -> None:
    result = {"status": value, "call_id": "c1", "tool_name": "get_weather", "data": {}}
    assert code_of(lambda: write_results("openai-chat", [WEATHER], [result])) == (
        "non_terminal_result"
    )


@pytest.mark.parametrize("surface", ["gemini-generate-content", "anthropic-messages"])
def test_huge_integer_arguments_are_refused(surface: str) -> None:
    # Gemini hashes id-less calls' arguments with json.dumps; everything downstream (intent
    # hash, database) serialises them too. An integer that cannot be printed is refused.
    response = inbound(surface, [WEATHER], with_ids=False)
    if surface == "anthropic-messages":
        response["content"][-1]["input"] = {"n": HUGE}
    else:
        response["candidates"][0]["content"]["parts"][-1]["functionCall"]["args"] = {"n": HUGE}
    assert code_of(lambda: read_proposals(surface, response, KNOWN)) == "invalid_tool_call_field"


def test_huge_integer_in_arguments_text_is_invalid_json() -> None:
    arguments = '{"n": ' + "9" * 5000 + "}"
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    response = {"finish_reason": "tool_calls", "message": {"tool_calls": [call]}}
    assert code_of(lambda: read_proposals("openai-chat", response, KNOWN)) == (
        "invalid_arguments_json"
    )


def test_mcp_id_mismatch_message_survives_a_huge_request_id() -> None:
    response = {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}

    def run() -> object:
        return normalise_result(
            response, provider_call_id="c1", tool_name="get_weather", request_id=HUGE
        )

    assert code_of(run) == "mcp_response_id_mismatch"


@pytest.mark.parametrize("value", [HUGE, deep(1_000)], ids=["huge-int", "deep-list"])
@pytest.mark.parametrize("surface", SURFACES)
def test_result_data_that_is_not_json_is_refused(surface: str, value: object) -> None:
    # Found by the 100k fuzz: pydantic refuses deep nesting with a plain ValueError, and
    # GenerateContent's object-valued envelope would carry a huge int out unserialisable.
    result = {"status": "succeeded", "call_id": "c1", "tool_name": "get_weather"}
    result["data"] = {"v": value}
    assert code_of(lambda: write_results(surface, [WEATHER], [result])) == "invalid_input"


@pytest.mark.parametrize("surface", SURFACES)
def test_a_retry_hint_too_large_to_print_is_refused(surface: str) -> None:
    error = {"code": "upstream_unavailable", "retry_after_ms": HUGE}
    result = {"status": "failed_retryable", "call_id": "c1", "tool_name": "get_weather"}
    result["error"] = error
    assert code_of(lambda: write_results(surface, [WEATHER], [result])) == "invalid_input"


@pytest.mark.parametrize(
    "arguments",
    ['{"city": "Seoul", "city": "Paris"}', '{"city": 1e400}', '{"unit": -Infinity}'],
    ids=["duplicate-key", "overflow", "infinity"],
)
def test_arguments_text_is_parsed_strictly(arguments: str) -> None:
    # The same parse as submit and the gate: a key twice is not last-wins, 1e400 is not inf.
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    response = {"finish_reason": "tool_calls", "message": {"tool_calls": [call]}}
    assert code_of(lambda: read_proposals("openai-chat", response, KNOWN)) == (
        "invalid_arguments_json"
    )


# A lone UTF-16 surrogate: half of "😀" (\ud83d\ude00), e.g. a stream whose other half never
# came. It decodes into a Python str, then breaks every encoder after the adapter.
LONE = "\ud83d"


@pytest.mark.parametrize("where", ["value", "key"])
@pytest.mark.parametrize("surface", SURFACES)
def test_lone_surrogates_in_arguments_are_invalid_json(surface: str, where: str) -> None:
    response = inbound(surface, [WEATHER])
    arguments = {"city": LONE} if where == "value" else {LONE: "Seoul"}
    if surface == "openai-chat":
        text = json.dumps(arguments)  # ASCII escapes: '{"city": "\\ud83d"}'
        response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = text
    elif surface == "openai-responses":
        response["output"][-1]["arguments"] = json.dumps(arguments)
    elif surface == "anthropic-messages":
        response["content"][-1]["input"] = arguments
    elif surface == "gemini-generate-content":
        response["candidates"][0]["content"]["parts"][-1]["functionCall"]["args"] = arguments
    else:
        response["steps"][-1]["arguments"] = arguments
    assert code_of(lambda: read_proposals(surface, response, KNOWN)) == "invalid_arguments_json"


def test_a_surrogate_pair_split_over_stream_pieces_is_one_character() -> None:
    def chunk(arguments: str, finish: str | None = None, first: bool = False) -> dict[str, Any]:
        call: dict[str, Any] = {"index": 0, "function": {"arguments": arguments}}
        if first:
            call = {"index": 0, "id": "c1", "function": {"name": "get_weather", **call["function"]}}
        delta = {"tool_calls": [call]} if arguments else {}
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    opening = chunk('{"city": "\\ud83d', first=True)
    whole = [opening, chunk('\\ude00"}'), chunk("", "tool_calls")]
    (call,) = read_stream("openai-chat", whole, KNOWN)
    assert call.arguments == {"city": "😀"}
    half = [opening, chunk('"}'), chunk("", "tool_calls")]
    assert code_of(lambda: read_stream("openai-chat", half, KNOWN)) == "invalid_arguments_json"
