"""Streams reassemble to the same proposals as the whole response, or to the same error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.core.types import ProposedCall
from callgate.producer.adapters import AdapterError, read_proposals, read_stream

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


def chat_helper_events(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What openai's chat.completions.stream() hands out: each chunk wrapped in a "chunk"
    event, followed by the events it derives from it."""
    events: list[dict[str, Any]] = []
    for raw in chunks:
        events.append({"type": "chunk", "chunk": raw, "snapshot": {}})
        for call in (raw["choices"] or [{}])[0].get("delta", {}).get("tool_calls", []):
            events.append(
                {
                    "type": "tool_calls.function.arguments.delta",
                    "index": call["index"],
                    "arguments": "{}",  # what the snapshot holds so far; never read
                    "arguments_delta": call.get("function", {}).get("arguments", ""),
                }
            )
    events.append({"type": "content.done", "content": "Checking."})
    return events


def test_chat_stream_helper_events_read_like_the_chunks() -> None:
    events = chat_helper_events(interleaved_chat_stream())
    assert read_stream("openai-chat", events, KNOWN) == [WEATHER, STOCK]
    with pytest.raises(AdapterError) as caught:
        read_stream("openai-chat", chat_helper_events(interleaved_chat_stream()[:-2]), KNOWN)
    assert caught.value.code == "invalid_provider_envelope"


def interaction_events(*steps: list[dict[str, Any]], status: str = "requires_action") -> list[Any]:
    events: list[dict[str, Any]] = [
        {"event_type": "interaction.created", "interaction": {"id": "i1", "status": "in_progress"}}
    ]
    for step in steps:
        events += step
    events.append(
        {"event_type": "interaction.completed", "interaction": {"id": "i1", "status": status}}
    )
    return events


def call_step(index: int, call: ProposedCall, *pieces: str, stop: bool = True) -> list[Any]:
    start = {"type": "function_call", "id": call.call_id, "name": call.tool_name}
    start["arguments"] = {} if pieces else call.arguments
    events: list[dict[str, Any]] = [{"event_type": "step.start", "index": index, "step": start}]
    events += [
        {
            "event_type": "step.delta",
            "index": index,
            "delta": {"type": "arguments_delta", "arguments": piece},
        }
        for piece in pieces
    ]
    if stop:
        events.append({"event_type": "step.stop", "index": index})
    return events


TEXT_STEP = [
    {"event_type": "step.start", "index": 0, "step": {"type": "model_output"}},
    {"event_type": "step.delta", "index": 0, "delta": {"type": "text", "text": "Checking."}},
    {"event_type": "step.stop", "index": 0},
]


def test_interactions_stream_joins_argument_deltas_by_step() -> None:
    events = interaction_events(
        TEXT_STEP, call_step(1, WEATHER, '{"ci', 'ty": "Seoul"}'), call_step(2, STOCK)
    )
    assert read_stream("gemini-interactions", events, KNOWN) == [WEATHER, STOCK]


def test_interactions_stream_reads_the_steps_of_the_completed_event_as_sent() -> None:
    events = interaction_events(status="requires_action")
    events[-1]["interaction"]["steps"] = inbound("gemini-interactions", [STOCK])["steps"]
    assert read_stream("gemini-interactions", events, KNOWN) == [STOCK]


def test_interactions_stream_of_a_final_answer_is_empty() -> None:
    assert (
        read_stream("gemini-interactions", interaction_events(TEXT_STEP, status="completed"), KNOWN)
        == []
    )


@pytest.mark.parametrize(
    ("events", "code"),
    [
        # cut before interaction.completed, even with every step stopped
        (interaction_events(call_step(0, WEATHER))[:-1], "invalid_provider_envelope"),
        (interaction_events(call_step(0, WEATHER, '{"city": "Se')), "invalid_arguments_json"),
        (
            interaction_events(call_step(0, WEATHER, '{"city": 1}', stop=False)),
            "malformed_tool_calls",
        ),
        (
            interaction_events(call_step(0, WEATHER), status="in_progress"),
            "invalid_provider_envelope",
        ),
        (interaction_events(call_step(0, WEATHER), status="failed"), "invalid_provider_envelope"),
        (interaction_events(status="requires_action"), "missing_tool_calls"),
        (
            interaction_events(call_step(0, WEATHER), call_step(0, STOCK)),
            "malformed_tool_calls",
        ),
        (
            interaction_events([{"event_type": "step.delta", "index": 3, "delta": {}}]),
            "malformed_tool_calls",
        ),
        (
            [
                *interaction_events(call_step(0, WEATHER))[:-1],
                {"event_type": "error", "error": {"code": "internal"}},
                interaction_events()[-1],
            ],
            "invalid_provider_envelope",
        ),
    ],
)
def test_interactions_stream_refusals(events: list[Any], code: str) -> None:
    with pytest.raises(AdapterError) as caught:
        read_stream("gemini-interactions", events, KNOWN)
    assert caught.value.code == code


def test_streams_may_arrive_as_json_text() -> None:
    assert read_stream("openai-chat", json.dumps(interleaved_chat_stream()), KNOWN) == [
        WEATHER,
        STOCK,
    ]


# --- Vertex AI's streamed function-call arguments (partialArgs, willContinue) -------------


def vertex(*calls: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {
        "content": {"role": "model", "parts": [{"functionCall": call} for call in calls]}
    }
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate]}


def arg(path: str, more: bool = False, **value: Any) -> dict[str, Any]:
    return {"jsonPath": path, **value, **({"willContinue": True} if more else {})}


def streamed(*pieces: list[dict[str, Any]], name: str = "get_weather") -> list[dict[str, Any]]:
    """One streamed call: opened by name, one chunk per list of partialArgs, closed."""
    chunks = [vertex({"name": name, "id": "c1", "willContinue": True})]
    chunks += [vertex({"partialArgs": args, "willContinue": True}) for args in pieces]
    return [*chunks, vertex({}, finish="STOP")]


def test_vertex_partial_args_are_put_back_together() -> None:
    chunks = streamed(
        [arg("$.city", True, stringValue="Se"), arg("$.city", True, stringValue="o")],
        [arg("$.city", stringValue="ul"), arg("$.days", numberValue=3.0)],
        [arg("$.opts.metric", boolValue=True), arg("$['odd key']", nullValue="NULL_VALUE")],
        [arg("$.stops[0].name", stringValue="A"), arg("$.stops[1].name", stringValue="B")],
    )
    (call,) = read_stream("gemini-generate-content", chunks, KNOWN)
    assert call.call_id == "c1"
    assert call.arguments == {
        "city": "Seoul",
        "days": 3,
        "opts": {"metric": True},
        "odd key": None,
        "stops": [{"name": "A"}, {"name": "B"}],
    }
    assert isinstance(call.arguments["days"], int)


def test_vertex_streamed_call_beside_a_whole_call_and_text() -> None:
    chunks = [
        vertex({"name": "get_stock", "id": "c2", "args": {"symbol": "ACME"}}),
        *streamed([arg("$.city", stringValue="Seoul")])[:-1],
        vertex({"willContinue": False}, finish="STOP"),
    ]
    assert read_stream("gemini-generate-content", chunks, KNOWN) == [STOCK, WEATHER]


@pytest.mark.parametrize(
    ("chunks", "code"),
    [
        # cut off: the call never closed (STOP came, MAX_TOKENS came, or nothing came)
        (
            [*streamed([arg("$.city", stringValue="Seoul")])[:-1], vertex(finish="STOP")],
            "invalid_provider_envelope",
        ),
        (
            [*streamed([arg("$.city", stringValue="Seoul")])[:-1], vertex(finish="MAX_TOKENS")],
            "invalid_provider_envelope",
        ),
        (streamed([arg("$.city", stringValue="Seoul")])[:-1], "invalid_provider_envelope"),
        # a string whose last piece never came
        (streamed([arg("$.city", True, stringValue="Se")]), "malformed_tool_calls"),
        (
            streamed([arg("$.city", True, stringValue="Se"), arg("$.x", stringValue="1")]),
            "malformed_tool_calls",
        ),
        (
            streamed([arg("$.city", stringValue="A")], [arg("$.city", stringValue="B")]),
            "malformed_tool_calls",
        ),
        (
            streamed([arg("$.a", stringValue="A"), arg("$.a.b", stringValue="B")]),
            "malformed_tool_calls",
        ),
        (streamed([arg("$.a[1]", stringValue="A")]), "malformed_tool_calls"),
        (streamed([arg("$.a", numberValue=1, stringValue="A")]), "malformed_tool_calls"),
        (streamed([arg("$.a", True, numberValue=1)]), "malformed_tool_calls"),
        (streamed([arg("$..a", stringValue="A")]), "malformed_tool_calls"),
        (streamed([arg("city", stringValue="A")]), "malformed_tool_calls"),
        (streamed([arg("$.a")]), "malformed_tool_calls"),
        # a second call opening before the first closed
        (
            [
                *streamed([arg("$.city", stringValue="Seoul")])[:-1],
                vertex({"name": "get_stock", "willContinue": True}),
                vertex({}, finish="STOP"),
            ],
            "malformed_tool_calls",
        ),
        (streamed([arg("$.city", stringValue="\ud83d")]), "invalid_arguments_json"),
    ],
)
def test_vertex_partial_args_refusals(chunks: list[dict[str, Any]], code: str) -> None:
    with pytest.raises(AdapterError) as caught:
        read_stream("gemini-generate-content", chunks, KNOWN)
    assert caught.value.code == code


def test_a_piece_of_a_streamed_call_is_not_a_whole_response() -> None:
    opening = vertex({"name": "get_weather", "willContinue": True}, finish="STOP")
    with pytest.raises(AdapterError) as caught:
        read_proposals("gemini-generate-content", opening, KNOWN)
    assert caught.value.code == "invalid_provider_envelope"
