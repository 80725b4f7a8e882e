"""Each official SDK's own streaming API, over a mocked HTTP transport.

The SDKs parse Server-Sent Events served a few bytes at a time (pieces split multi-byte UTF-8
characters). For every surface and every stream helper:

- a complete stream reads to the same proposals as the SDK's accumulated message (or, where
  the SDK has no accumulator, the same response fetched whole);
- a stream cut at any byte offset before its stop signal is refused, whether its events are
  read or the SDK's accumulated snapshot of them;
- at no offset does a call come out other than complete: a cut after the stop signal may
  still be read, but only to the full list of calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from callgate.core.types import ProposedCall
from callgate.producer.adapters import AdapterError, read_proposals, read_stream

from .support import load

httpx = pytest.importorskip("httpx2")

KNOWN = {"refund", "get_weather", "get_stock_price", "GetWeatherArgs", "Query"}
NOTE = "환불 é😀"
# "1000" is streamed as "10" + "00": a cut between them must never give a refund of 10.
REFUND_ARGS = {"amount": 1000, "note": NOTE}
WEATHER_ARGS = {"city": "서울"}
REFUND_TEXT = json.dumps(REFUND_ARGS, ensure_ascii=False)
WEATHER_TEXT = json.dumps(WEATHER_ARGS, ensure_ascii=False)
# Piece sizes for complete streams; 1, 2 and 5 all split the multi-byte characters above.
STEPS = (1, 2, 5, 4096)
CUT_STEP = 5


def pieces(text: str) -> list[str]:
    """``text`` in pieces, one boundary between the "10" and "00" of 1000."""
    first = min(3, len(text))
    at = max(first, text.index("1000") + 2 if "1000" in text else len(text) // 2)
    return [text[:first], text[first:at], text[at:]]


class Server:
    """Serves ``body`` in ``step``-byte pieces to whatever the SDK asks."""

    def __init__(self, body: bytes, content_type: str = "text/event-stream") -> None:
        self.body = body
        self.step = CUT_STEP
        self.content_type = content_type
        self.clients: dict[str, Any] = {}  # one SDK client per kind, reused across cuts

    def _pieces(self) -> Iterator[bytes]:
        for start in range(0, len(self.body), self.step):
            yield self.body[start : start + self.step]

    def handler(self, request: Any) -> Any:
        return httpx.Response(
            200, headers={"content-type": self.content_type}, content=self._pieces()
        )

    def client(self) -> Any:
        return httpx.Client(transport=httpx.MockTransport(self.handler))


def sse(events: list[dict[str, Any]], *, name: str | None = None, done: bool = False) -> bytes:
    """An SSE body; ``name`` is the event field that names each event (Anthropic, Responses)."""
    out = ""
    for event in events:
        if name is not None:
            out += f"event: {event[name]}\n"
        out += f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
    if done:
        out += "data: [DONE]\n\n"
    return out.encode("utf-8")


def block_start(body: bytes, event: dict[str, Any]) -> int:
    """Where ``event``'s SSE block starts in ``body``."""
    marker = json.dumps(event, ensure_ascii=False).encode("utf-8")
    at = body.index(marker)
    return body.rindex(b"\n\n", 0, at) + 2


def splits_a_character(body: bytes, step: int) -> bool:
    return any((body[at] & 0xC0) == 0x80 for at in range(step, len(body), step))


# What one helper gives back: the proposals, or why there are none — the AdapterError code,
# or "sdk: ..." when the SDK itself raised (a body cut inside a UTF-8 character, a helper
# that refuses a stream without its terminal event).
Outcome = list[ProposedCall] | str
Read = Callable[[], list[ProposedCall]]
# Drives the SDK over a server; gives back how to read what the SDK handed out.
Reader = Callable[["Server"], Read]


@dataclass
class Case:
    surface: str
    body: bytes
    terminal: dict[str, Any]  # the event carrying the stop signal
    expected: list[ProposedCall]
    helpers: dict[str, Reader]  # name -> read the stream through that helper
    # Helpers that only ever see part of a stream: checked on cut-off streams only.
    cut_only: dict[str, Reader] = field(default_factory=dict)

    server: Server = field(default_factory=lambda: Server(b""))

    def run(self, helper: str, body: bytes, step: int = CUT_STEP) -> Outcome:
        server = self.server
        server.body, server.step = body, step
        reader = {**self.helpers, **self.cut_only}[helper]
        try:
            read = reader(server)
        except Exception as exc:  # only SDK code runs in a reader; ours runs below
            return f"sdk: {type(exc).__name__}"
        try:
            return read()
        except AdapterError as exc:
            return str(exc.code)


def cut_offsets(body: bytes, terminal: dict[str, Any]) -> list[int]:
    """Where to cut ``body``: every byte from a few before to a few after each event boundary,
    every byte of the event carrying the stop signal, and a stride through the rest."""
    stop_at = block_start(body, terminal)
    stop_end = body.index(b"\n\n", stop_at) + 2
    offsets = set(range(0, len(body), max(1, len(body) // 100)))
    offsets.update(range(stop_at - 8, stop_end + 8))
    boundary = body.find(b"\n\n")
    while boundary != -1:
        offsets.update(range(boundary - 2, boundary + 4))
        boundary = body.find(b"\n\n", boundary + 2)
    return sorted(offset for offset in offsets if 0 <= offset < len(body))


def check_cuts(case: Case, helper: str) -> tuple[int, int]:
    """Cut the body at many byte offsets; returns (offsets refused, offsets tried)."""
    stop_at = block_start(case.body, case.terminal)
    offsets = cut_offsets(case.body, case.terminal)
    refused = 0
    for cut in offsets:
        outcome = case.run(helper, case.body[:cut])
        if isinstance(outcome, str):
            refused += 1
            continue
        # Read at all: only once the stop signal is in, and then every call, complete.
        assert cut > stop_at, (helper, cut, outcome)
        assert outcome == case.expected, (helper, cut, outcome)
    return refused, len(offsets)


# --- OpenAI Chat Completions ------------------------------------------------------------------


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": [choice],
    }


def chat_call(index: int, call_id: str, name: str, text: str) -> list[dict[str, Any]]:
    first, *rest = pieces(text)
    head = {"index": index, "id": call_id, "type": "function"}
    out = [chat_chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": first}}]})]
    out += [
        chat_chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        for piece in rest
    ]
    return out


CHAT_TERMINAL = chat_chunk({}, "tool_calls")
CHAT_EVENTS = [
    chat_chunk({"role": "assistant", "content": "확인 중…"}),
    *chat_call(0, "call_refund", "refund", REFUND_TEXT),
    *chat_call(1, "call_weather", "get_weather", WEATHER_TEXT),
    CHAT_TERMINAL,
    {**chat_chunk({}), "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}},
]
CHAT_EXPECTED = [
    ProposedCall(call_id="call_refund", tool_name="refund", arguments=REFUND_ARGS),
    ProposedCall(call_id="call_weather", tool_name="get_weather", arguments=WEATHER_ARGS),
]


def openai_client(server: Server) -> Any:
    if "openai" not in server.clients:
        openai = pytest.importorskip("openai")
        server.clients["openai"] = openai.OpenAI(
            api_key="test", base_url="http://test/v1", http_client=server.client(), max_retries=0
        )
    return server.clients["openai"]


def chat_create(server: Server) -> Read:
    stream = openai_client(server).chat.completions.create(
        model="gpt-test", messages=[], stream=True
    )
    events = list(stream)
    return lambda: read_stream("openai-chat", events, KNOWN)


def chat_helper_events(server: Server) -> Read:
    with openai_client(server).chat.completions.stream(model="gpt-test", messages=[]) as stream:
        events = list(stream)
    return lambda: read_stream("openai-chat", events, KNOWN)


def chat_helper_final(server: Server) -> Read:
    with openai_client(server).chat.completions.stream(model="gpt-test", messages=[]) as stream:
        stream.until_done()
        final = stream.get_final_completion()
    return lambda: read_proposals("openai-chat", final, KNOWN)


def chat_state_snapshot(server: Server) -> Read:
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state: Any = ChatCompletionStreamState()
    stream = openai_client(server).chat.completions.create(
        model="gpt-test", messages=[], stream=True
    )
    for chunk in stream:
        state.handle_chunk(chunk)
    snapshot = state.current_completion_snapshot  # AssertionError before any chunk
    return lambda: read_proposals("openai-chat", snapshot, KNOWN)


def chat_case(events: list[dict[str, Any]], expected: list[ProposedCall]) -> Case:
    terminal = next(e for e in events if e["choices"] and e["choices"][0]["finish_reason"])
    return Case(
        "openai-chat",
        sse(events, done=True),
        terminal,
        expected,
        {
            "create(stream=True)": chat_create,
            "stream() events": chat_helper_events,
            "stream().get_final_completion()": chat_helper_final,
            "ChatCompletionStreamState snapshot": chat_state_snapshot,
        },
    )


# --- OpenAI Responses -------------------------------------------------------------------------


def response(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-test",
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


RESPONSES_MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "확인 중…", "annotations": []}],
}


def function_item(index: int, name: str, text: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{index}",
        "call_id": f"call_{name}",
        "name": name,
        "arguments": text,
        "status": "completed",
    }


def responses_events() -> list[dict[str, Any]]:
    calls = [function_item(1, "refund", REFUND_TEXT), function_item(2, "get_weather", WEATHER_TEXT)]
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response("in_progress", [])},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**RESPONSES_MESSAGE, "status": "in_progress", "content": []},
        },
        {"type": "response.output_item.done", "output_index": 0, "item": RESPONSES_MESSAGE},
    ]
    for index, item in enumerate(calls, start=1):
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
        )
        events += [
            {
                "type": "response.function_call_arguments.delta",
                "output_index": index,
                "item_id": item["id"],
                "delta": piece,
            }
            for piece in pieces(item["arguments"])
        ]
        events += [
            {
                "type": "response.function_call_arguments.done",
                "output_index": index,
                "item_id": item["id"],
                "name": item["name"],
                "arguments": item["arguments"],
            },
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    events.append(
        {
            "type": "response.completed",
            "response": response("completed", [RESPONSES_MESSAGE, *calls]),
        }
    )
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def responses_create(server: Server) -> Read:
    stream = openai_client(server).responses.create(model="gpt-test", input="hi", stream=True)
    events = list(stream)
    return lambda: read_stream("openai-responses", events, KNOWN)


def responses_helper_events(server: Server) -> Read:
    with openai_client(server).responses.stream(model="gpt-test", input="hi") as stream:
        events = list(stream)
    return lambda: read_stream("openai-responses", events, KNOWN)


def responses_helper_final(server: Server) -> Read:
    with openai_client(server).responses.stream(model="gpt-test", input="hi") as stream:
        stream.until_done()
        final = stream.get_final_response()  # RuntimeError without response.completed
    return lambda: read_proposals("openai-responses", final, KNOWN)


def responses_case() -> Case:
    events = responses_events()
    return Case(
        "openai-responses",
        sse(events, name="type"),
        events[-1],
        [
            ProposedCall(call_id="call_refund", tool_name="refund", arguments=REFUND_ARGS),
            ProposedCall(
                call_id="call_get_weather", tool_name="get_weather", arguments=WEATHER_ARGS
            ),
        ],
        {
            "create(stream=True)": responses_create,
            "stream() events": responses_helper_events,
            # The helper's snapshot is private; get_final_response() raises RuntimeError
            # for a stream without response.completed, which the cut-off check counts.
            "stream().get_final_response()": responses_helper_final,
        },
    )


# --- Anthropic Messages -----------------------------------------------------------------------


def anthropic_block(index: int, block: dict[str, Any], text: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": block}
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": piece},
        }
        for piece in pieces(text)
    ]
    return [*events, {"type": "content_block_stop", "index": index}]


ANTHROPIC_TERMINAL = {
    "type": "message_delta",
    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
    "usage": {"output_tokens": 9},
}
ANTHROPIC_EVENTS: list[dict[str, Any]] = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "확인 중…"},
    },
    {"type": "content_block_stop", "index": 0},
    *anthropic_block(
        1, {"type": "tool_use", "id": "toolu_refund", "name": "refund", "input": {}}, REFUND_TEXT
    ),
    *anthropic_block(
        2,
        {"type": "tool_use", "id": "toolu_weather", "name": "get_weather", "input": {}},
        WEATHER_TEXT,
    ),
    ANTHROPIC_TERMINAL,
    {"type": "message_stop"},
]


def anthropic_client(server: Server) -> Any:
    if "anthropic" not in server.clients:
        anthropic = pytest.importorskip("anthropic")
        server.clients["anthropic"] = anthropic.Anthropic(
            api_key="test", base_url="http://test", http_client=server.client(), max_retries=0
        )
    return server.clients["anthropic"]


ANTHROPIC_REQUEST: dict[str, Any] = {"model": "claude-test", "max_tokens": 64, "messages": []}


def anthropic_create(server: Server) -> Read:
    stream = anthropic_client(server).messages.create(**ANTHROPIC_REQUEST, stream=True)
    events = list(stream)
    return lambda: read_stream("anthropic-messages", events, KNOWN)


def anthropic_helper_events(server: Server) -> Read:
    with anthropic_client(server).messages.stream(**ANTHROPIC_REQUEST) as stream:
        events = list(stream)
    return lambda: read_stream("anthropic-messages", events, KNOWN)


def anthropic_helper_final(server: Server) -> Read:
    with anthropic_client(server).messages.stream(**ANTHROPIC_REQUEST) as stream:
        stream.until_done()
        final = stream.get_final_message()  # AssertionError before message_start
    return lambda: read_proposals("anthropic-messages", final, KNOWN)


def anthropic_case(events: list[dict[str, Any]], expected: list[ProposedCall]) -> Case:
    terminal = next(e for e in events if e["type"] == "message_delta")
    return Case(
        "anthropic-messages",
        sse(events, name="type"),
        terminal,
        expected,
        {
            "create(stream=True)": anthropic_create,
            "stream() events": anthropic_helper_events,
            "stream().get_final_message()": anthropic_helper_final,
        },
    )


# --- Gemini GenerateContent (Gemini API and Vertex AI) ---------------------------------------


def gemini_chunk(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "modelVersion": "gemini-test"}


GEMINI_TERMINAL = {
    **gemini_chunk([{"text": ""}], "STOP"),
    "usageMetadata": {"promptTokenCount": 1, "totalTokenCount": 2},
}
GEMINI_EVENTS = [
    gemini_chunk([{"text": "확인 중…"}]),
    gemini_chunk([{"functionCall": {"name": "refund", "args": REFUND_ARGS}}]),
    gemini_chunk([{"functionCall": {"name": "get_weather", "args": WEATHER_ARGS}}]),
    GEMINI_TERMINAL,
]


def note_pieces() -> list[dict[str, Any]]:
    first, *rest = pieces(NOTE)
    out = [{"jsonPath": "$.note", "stringValue": first, "willContinue": True}]
    out += [{"jsonPath": "$.note", "stringValue": piece, "willContinue": True} for piece in rest]
    out[-1].pop("willContinue")
    return out


# Vertex AI's opt-in streamed arguments (functionCallingConfig.streamFunctionCallArguments):
# a call opens with its name and willContinue, its arguments arrive as partialArgs (a string
# may come in several pieces of one jsonPath), and a part without willContinue closes it.
VERTEX_TERMINAL = {**gemini_chunk([{"functionCall": {}}], "STOP"), "usageMetadata": {}}
VERTEX_EVENTS = [
    gemini_chunk([{"text": "확인 중…"}]),
    gemini_chunk([{"functionCall": {"name": "refund", "willContinue": True}}]),
    gemini_chunk([{"functionCall": {"partialArgs": note_pieces()[:2], "willContinue": True}}]),
    gemini_chunk(
        [
            {
                "functionCall": {
                    "partialArgs": [
                        *note_pieces()[2:],
                        {"jsonPath": "$.amount", "numberValue": 1000},
                    ],
                    "willContinue": True,
                }
            }
        ]
    ),
    gemini_chunk([{"functionCall": {}}]),
    gemini_chunk([{"functionCall": {"name": "get_weather", "willContinue": True}}]),
    gemini_chunk(
        [
            {
                "functionCall": {
                    "partialArgs": [{"jsonPath": "$.city", "stringValue": WEATHER_ARGS["city"]}],
                    "willContinue": True,
                }
            }
        ]
    ),
    VERTEX_TERMINAL,
]
GEMINI_WHOLE = gemini_chunk(
    [
        {"text": "확인 중…"},
        {"functionCall": {"name": "refund", "args": REFUND_ARGS}},
        {"functionCall": {"name": "get_weather", "args": WEATHER_ARGS}},
    ],
    "STOP",
)


def genai_client(server: Server, *, vertex: bool) -> Any:
    kind = f"genai-vertex={vertex}"
    if kind not in server.clients:
        genai = pytest.importorskip("google.genai")
        options = genai.types.HttpOptions(base_url="http://test", httpx_client=server.client())
        server.clients[kind] = genai.Client(vertexai=vertex, api_key="test", http_options=options)
    return server.clients[kind]


def gemini_stream(vertex: bool) -> Reader:
    def read(server: Server) -> Read:
        chunks = list(
            genai_client(server, vertex=vertex).models.generate_content_stream(
                model="gemini-test", contents="hi"
            )
        )
        return lambda: read_stream("gemini-generate-content", chunks, KNOWN)

    return read


def gemini_chunks_read_whole(vertex: bool) -> Reader:
    """google-genai has no stream accumulator: what a caller holds is the chunks. No chunk of
    a cut-off stream, read as a whole response, may give a call."""

    def read(server: Server) -> Read:
        chunks = list(
            genai_client(server, vertex=vertex).models.generate_content_stream(
                model="gemini-test", contents="hi"
            )
        )

        def each() -> list[ProposedCall]:
            refusal = AdapterError("no chunk")
            for chunk in chunks:
                try:
                    calls = read_proposals("gemini-generate-content", chunk, KNOWN)
                except AdapterError as exc:
                    refusal = exc
                    continue
                if calls:
                    return calls
            raise refusal

        return each

    return read


def gemini_case(events: list[dict[str, Any]], terminal: dict[str, Any], *, vertex: bool) -> Case:
    return Case(
        "gemini-generate-content",
        sse(events),
        terminal,
        read_proposals("gemini-generate-content", GEMINI_WHOLE, KNOWN),
        {"generate_content_stream()": gemini_stream(vertex)},
        {"each chunk read whole": gemini_chunks_read_whole(vertex)},
    )


# --- Gemini Interactions ----------------------------------------------------------------------


INTERACTION_STEPS = [
    {"type": "thought", "signature": "c2ln"},
    {"type": "model_output", "content": [{"type": "text", "text": "확인 중…"}]},
    {"type": "function_call", "id": "fc_refund", "name": "refund", "arguments": REFUND_ARGS},
    {"type": "function_call", "id": "fc_weather", "name": "get_weather", "arguments": WEATHER_ARGS},
]
INTERACTION_TERMINAL = {
    "event_type": "interaction.completed",
    "interaction": {"id": "int_1", "status": "requires_action", "model": "gemini-test"},
}


def interaction_events() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "event_type": "interaction.created",
            "interaction": {"id": "int_1", "status": "in_progress"},
        },
        {"event_type": "step.start", "index": 0, "step": {"type": "thought"}},
        {
            "event_type": "step.delta",
            "index": 0,
            "delta": {"type": "thought_signature", "signature": "c2ln"},
        },
        {"event_type": "step.stop", "index": 0},
        {"event_type": "step.start", "index": 1, "step": {"type": "model_output"}},
        {"event_type": "step.delta", "index": 1, "delta": {"type": "text", "text": "확인 중…"}},
        {"event_type": "step.stop", "index": 1},
        # streamed arguments
        {
            "event_type": "step.start",
            "index": 2,
            "step": {"type": "function_call", "id": "fc_refund", "name": "refund", "arguments": {}},
        },
        *[
            {
                "event_type": "step.delta",
                "index": 2,
                "delta": {"type": "arguments_delta", "arguments": piece},
            }
            for piece in pieces(REFUND_TEXT)
        ],
        {"event_type": "step.stop", "index": 2},
        # arguments whole in the start event
        {"event_type": "step.start", "index": 3, "step": INTERACTION_STEPS[3]},
        {"event_type": "step.stop", "index": 3},
        {
            "event_type": "interaction.status_update",
            "interaction_id": "int_1",
            "status": "requires_action",
        },
        INTERACTION_TERMINAL,
    ]
    return [{**event, "event_id": f"evt_{n}"} for n, event in enumerate(events)]


def interactions_stream(server: Server) -> Read:
    events = list(
        genai_client(server, vertex=False).interactions.create(
            model="gemini-test", input="hi", stream=True
        )
    )
    return lambda: read_stream("gemini-interactions", events, KNOWN)


def interactions_case() -> Case:
    whole = {"id": "int_1", "status": "requires_action", "steps": INTERACTION_STEPS}
    events = interaction_events()
    return Case(
        "gemini-interactions",
        sse(events, name="event_type"),
        events[-1],
        read_proposals("gemini-interactions", whole, KNOWN),
        {"interactions.create(stream=True)": interactions_stream},
    )


def interactions_whole(server: Server) -> Read:
    interaction = genai_client(server, vertex=False).interactions.create(
        model="gemini-test", input="hi"
    )
    return lambda: read_proposals("gemini-interactions", interaction, KNOWN)


# --- the cases --------------------------------------------------------------------------------


def recorded_chat(n: int) -> Case:
    # The recorded chunks as plain JSON are read elsewhere (test_streams, test_sdk); here the
    # SDKs parse them off the wire, through every helper.
    events = load(f"openai_chat_stream_recorded_{n}.json")
    return chat_case(events, read_stream("openai-chat", events, KNOWN))


def recorded_anthropic() -> Case:
    events = load("anthropic_stream_tool_use_response.json")
    return anthropic_case(events, read_stream("anthropic-messages", events, KNOWN))


CASES: dict[str, Callable[[], Case]] = {
    "openai-chat": lambda: chat_case(CHAT_EVENTS, CHAT_EXPECTED),
    "openai-responses": responses_case,
    "anthropic-messages": lambda: anthropic_case(
        ANTHROPIC_EVENTS,
        [
            ProposedCall(call_id="toolu_refund", tool_name="refund", arguments=REFUND_ARGS),
            ProposedCall(call_id="toolu_weather", tool_name="get_weather", arguments=WEATHER_ARGS),
        ],
    ),
    "gemini-generate-content": lambda: gemini_case(GEMINI_EVENTS, GEMINI_TERMINAL, vertex=False),
    "gemini-generate-content (Vertex partialArgs)": lambda: gemini_case(
        VERTEX_EVENTS, VERTEX_TERMINAL, vertex=True
    ),
    "gemini-interactions": interactions_case,
}
HELPERS = [(name, helper) for name, make in CASES.items() for helper in make().helpers]
CUT_HELPERS = HELPERS + [
    (name, helper) for name, make in CASES.items() for helper in make().cut_only
]


@pytest.mark.parametrize(("case_name", "helper"), HELPERS)
def test_a_complete_stream_reads_like_the_sdk_accumulated_message(
    case_name: str, helper: str
) -> None:
    case = CASES[case_name]()
    for step in STEPS:
        assert case.run(helper, case.body, step) == case.expected, (helper, step)


@pytest.mark.parametrize(("case_name", "helper"), CUT_HELPERS)
def test_a_stream_cut_at_any_byte_never_runs_a_truncated_call(case_name: str, helper: str) -> None:
    case = CASES[case_name]()
    assert splits_a_character(case.body, CUT_STEP)
    refused, tried = check_cuts(case, helper)
    stop_at = block_start(case.body, case.terminal)
    assert refused >= len([cut for cut in cut_offsets(case.body, case.terminal) if cut <= stop_at])
    assert tried > 150


@pytest.mark.parametrize("n", range(4))
def test_recorded_chat_streams_read_like_the_recorded_completions(n: int) -> None:
    case = recorded_chat(n)
    for helper in case.helpers:
        assert case.run(helper, case.body, 3) == case.expected, helper
    check_cuts(case, "stream().get_final_completion()")


def test_recorded_anthropic_stream_reads_like_its_final_message() -> None:
    case = recorded_anthropic()
    for helper in case.helpers:
        assert case.run(helper, case.body, 3) == case.expected, helper
    check_cuts(case, "stream().get_final_message()")


def test_the_expected_accumulated_messages_come_from_the_sdks_too() -> None:
    # The Gemini cases compare a stream with the same response fetched whole: check that the
    # SDKs read those whole responses as the cases expect.
    server = Server(json.dumps(GEMINI_WHOLE).encode(), content_type="application/json")
    response = genai_client(server, vertex=True).models.generate_content(
        model="gemini-test", contents="hi"
    )
    assert (
        read_proposals("gemini-generate-content", response, KNOWN)
        == CASES["gemini-generate-content"]().expected
    )
    whole = {"id": "int_1", "status": "requires_action", "steps": INTERACTION_STEPS}
    server = Server(json.dumps(whole).encode(), content_type="application/json")
    assert interactions_whole(server)() == interactions_case().expected
