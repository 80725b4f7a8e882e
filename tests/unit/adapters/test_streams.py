"""Streams reassemble to the same proposals as the whole response, or to the same error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from producer.adapters import AdapterError, read_proposals, read_stream
from store.types import ProposedCall

from .support import PLACES, inbound

KNOWN = {"get_weather", "get_stock"}
WEATHER = ProposedCall(call_id="c1", tool_name="get_weather", arguments={"city": "Seoul"})
STOCK = ProposedCall(call_id="c2", tool_name="get_stock", arguments={"symbol": "ACME"})


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def tool_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


def interleaved_chat_stream() -> list[dict[str, Any]]:
    return [
        chunk({"role": "assistant", "content": "Checking."}),
        chunk(
            tool_delta(
                0, id="c1", type="function", function={"name": "get_weather", "arguments": ""}
            )
        ),
        chunk(
            tool_delta(
                1, id="c2", type="function", function={"name": "get_stock", "arguments": '{"sym'}
            )
        ),
        chunk(tool_delta(0, function={"arguments": '{"city": '})),
        chunk(tool_delta(1, function={"arguments": 'bol": "ACME"}'})),
        chunk(tool_delta(0, function={"arguments": '"Seoul"}'})),
        chunk(finish="tool_calls"),
        {"object": "chat.completion.chunk", "choices": [], "usage": {"total_tokens": 9}},
    ]


def test_chat_deltas_are_joined_by_index() -> None:
    assert read_stream("openai-chat", interleaved_chat_stream(), KNOWN) == [WEATHER, STOCK]


def test_chat_stream_text_between_and_after_tool_deltas_hides_nothing() -> None:
    events = interleaved_chat_stream()
    events.insert(3, chunk({"content": " still checking"}))
    events.insert(-2, chunk({"content": " done."}))
    assert read_stream("openai-chat", events, KNOWN) == [WEATHER, STOCK]


def test_chat_stream_of_a_final_answer_is_empty() -> None:
    events = [chunk({"role": "assistant", "content": "Hi"}), chunk(finish="stop")]
    assert read_stream("openai-chat", events, KNOWN) == []


@pytest.mark.parametrize(
    ("events", "code"),
    [
        (interleaved_chat_stream()[:-2], "invalid_provider_envelope"),  # cut before finish_reason
        (
            [
                chunk(
                    tool_delta(
                        0, id="c1", function={"name": "get_weather", "arguments": '{"city":'}
                    )
                ),
                chunk(finish="tool_calls"),
            ],
            "invalid_arguments_json",
        ),
        (
            [
                chunk({"tool_calls": [{"id": "c1", "function": {"name": "get_weather"}}]}),
                chunk(finish="tool_calls"),
            ],
            "malformed_tool_calls",
        ),
        (
            [
                chunk(tool_delta(0, id="c1")),
                chunk(tool_delta(0, id="c9")),
                chunk(finish="tool_calls"),
            ],
            "malformed_tool_calls",
        ),
        (
            [
                chunk(
                    tool_delta(0, id="c1", type="custom", custom={"name": "run_sql", "input": "x"})
                ),
                chunk(finish="tool_calls"),
            ],
            "invalid_tool_call_field",
        ),
        ([chunk(finish="tool_calls")], "missing_tool_calls"),
        (
            [{"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]}],
            "invalid_provider_envelope",
        ),
        ([{"error": {"message": "boom"}}], "invalid_provider_envelope"),
        ({"choices": []}, "invalid_provider_envelope"),
    ],
)
def test_chat_stream_refusals(events: Any, code: str) -> None:
    with pytest.raises(AdapterError) as caught:
        read_stream("openai-chat", events, KNOWN)
    assert caught.value.code == code


def anthropic_stream(
    *pieces: str, stop_reason: str | None = "tool_use", stop_block: bool = True
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1", "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": "Checking."},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {}},
        },
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": piece},
        }
        for piece in pieces
    ]
    if stop_block:
        events.append({"type": "content_block_stop", "index": 1})
    if stop_reason is not None:
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason},
                "usage": {"output_tokens": 5},
            }
        )
    events.append({"type": "message_stop"})
    return events


def test_anthropic_input_json_deltas_are_joined() -> None:
    assert read_stream(
        "anthropic-messages", anthropic_stream('{"ci', 'ty": "Se', 'oul"}'), KNOWN
    ) == [WEATHER]


def block_events(index: int, block: dict[str, Any], json_text: str = "") -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": block}
    ]
    if json_text:
        delta = {"type": "input_json_delta", "partial_json": json_text}
        events.append({"type": "content_block_delta", "index": index, "delta": delta})
    return [*events, {"type": "content_block_stop", "index": index}]


def test_anthropic_stream_blocks_between_and_after_tool_use_hide_nothing() -> None:
    # text, a provider-run server_tool_use and its result between the two tool_use blocks,
    # thinking after them: only the tool_use blocks are proposals, in order.
    tool = {"type": "tool_use", "input": {}}
    server = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    found = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    events = [
        *block_events(0, {**tool, "id": "c1", "name": "get_weather"}, '{"city": "Seoul"}'),
        *block_events(1, {"type": "text", "text": "and"}),
        *block_events(2, server, '{"query": "acme"}'),
        *block_events(3, found),
        *block_events(4, {**tool, "id": "c2", "name": "get_stock"}, '{"symbol": "ACME"}'),
        *block_events(5, {"type": "thinking", "thinking": "done", "signature": "sig"}),
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
    ]
    assert read_stream("anthropic-messages", events, KNOWN) == [WEATHER, STOCK]


def test_anthropic_tool_without_arguments_keeps_the_start_input() -> None:
    (call,) = read_stream("anthropic-messages", anthropic_stream(""), KNOWN)
    assert call.arguments == {}


@pytest.mark.parametrize(
    ("events", "code"),
    [
        (anthropic_stream('{"city": Seoul}'), "invalid_arguments_json"),
        (anthropic_stream('{"city": "Seoul"}', stop_block=False), "malformed_tool_calls"),
        (anthropic_stream('{"city": "Seoul"}', stop_reason=None), "invalid_provider_envelope"),
        (
            [
                *anthropic_stream('{"city": "Seoul"}')[:3],
                {"type": "content_block_delta", "index": 5},
            ],
            "malformed_tool_calls",
        ),
        ([{"type": "error", "error": {"type": "overloaded_error"}}], "invalid_provider_envelope"),
        (anthropic_stream("[1]"), "invalid_arguments_json"),
    ],
)
def test_anthropic_stream_refusals(events: list[dict[str, Any]], code: str) -> None:
    with pytest.raises(AdapterError) as caught:
        read_stream("anthropic-messages", events, KNOWN)
    assert caught.value.code == code


def test_responses_stream_reads_the_terminal_response() -> None:
    final = inbound("openai-responses", [WEATHER, STOCK])
    events = [
        {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}},
        {"type": "response.function_call_arguments.delta", "delta": '{"ci'},
        {"type": "response.completed", "response": final},
    ]
    assert read_stream("openai-responses", events, KNOWN) == [WEATHER, STOCK]
    with pytest.raises(AdapterError) as caught:
        read_stream("openai-responses", events[:-1], KNOWN)
    assert caught.value.code == "invalid_provider_envelope"


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("with_ids", [True, False])
def test_gemini_stream_chunks_give_the_same_calls_as_the_whole_response(
    with_ids: bool, where: str
) -> None:
    whole = inbound("gemini-generate-content", [WEATHER, STOCK], with_ids=with_ids, where=where)
    parts = whole["candidates"][0]["content"]["parts"]
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [part]}}]} for part in parts
    ] + [
        {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP"}]},
        {"usageMetadata": {}},
    ]
    assert read_stream("gemini-generate-content", chunks, KNOWN) == read_proposals(
        "gemini-generate-content", whole, KNOWN
    )
    with pytest.raises(AdapterError) as caught:
        read_stream("gemini-generate-content", chunks[:2], KNOWN)
    assert caught.value.code == "invalid_provider_envelope"


def test_interactions_streams_are_not_supported() -> None:
    with pytest.raises(AdapterError) as caught:
        read_stream("gemini-interactions", [], KNOWN)
    assert caught.value.code == "unsupported_surface"


def test_streams_may_arrive_as_json_text() -> None:
    assert read_stream("openai-chat", json.dumps(interleaved_chat_stream()), KNOWN) == [
        WEATHER,
        STOCK,
    ]
