"""Unfinished or cut-off responses are never read as a final answer or a complete call list.

Every surface has some way of saying "this is not done" (a status, a stop or finish reason).
Calls under it may be truncated or not emitted yet, and "no calls" under it is not a final
answer; both are refused, from whole responses and from streams alike.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from callgate.core.types import ProposedCall
from callgate.producer.adapters import AdapterError, read_proposals, read_stream

from .support import inbound

KNOWN = {"get_weather", "get_stock"}
WEATHER = ProposedCall(call_id="c1", tool_name="get_weather", arguments={"city": "Seoul"})
STOCK = ProposedCall(call_id="c2", tool_name="get_stock", arguments={"symbol": "ACME"})


def refused(surface: str, response: object, *, stream: bool = False) -> AdapterError:
    with pytest.raises(AdapterError) as caught:
        (read_stream if stream else read_proposals)(surface, response, KNOWN)
    return caught.value


# --- OpenAI Responses ----------------------------------------------------------------------


def responses(status: str | None, proposals: list[ProposedCall]) -> dict[str, Any]:
    response: dict[str, Any] = inbound("openai-responses", proposals)
    if status is None:
        del response["status"]
    else:
        response["status"] = status
    return response


@pytest.mark.parametrize("status", ["in_progress", "queued", "incomplete", "cancelled", "failed"])
@pytest.mark.parametrize("proposals", [[], [WEATHER, STOCK]])
def test_responses_only_a_completed_response_is_read(
    status: str, proposals: list[ProposedCall]
) -> None:
    error = refused("openai-responses", responses(status, proposals))
    assert error.code == "invalid_provider_envelope"
    assert status in error.message and "not finished" in error.message


def test_responses_background_response_still_running_is_not_a_final_answer() -> None:
    error = refused("openai-responses", {"status": "in_progress", "output": []})
    assert error.code == "invalid_provider_envelope"


@pytest.mark.parametrize("proposals", [[], [WEATHER, STOCK]])
def test_responses_completed_responses_are_read(proposals: list[ProposedCall]) -> None:
    assert read_proposals("openai-responses", responses("completed", proposals), KNOWN) == proposals


@pytest.mark.parametrize("item_status", ["in_progress", "incomplete"])
def test_responses_unfinished_function_call_item_is_refused(item_status: str) -> None:
    response = responses("completed", [WEATHER])
    response["output"][-1]["status"] = item_status
    assert refused("openai-responses", response).code == "invalid_tool_call_field"


@pytest.mark.parametrize("terminal", ["response.incomplete", "response.failed"])
def test_responses_stream_ending_incomplete_is_refused(terminal: str) -> None:
    final = responses("incomplete" if terminal.endswith("incomplete") else "failed", [WEATHER])
    events = [{"type": terminal, "response": final}]
    error = refused("openai-responses", events, stream=True)
    assert error.code == "invalid_provider_envelope"


# --- Gemini Interactions -------------------------------------------------------------------


@pytest.mark.parametrize(
    "status",
    [
        "in_progress",
        "queued",
        "idle",
        "requires_continuation",
        "incomplete",
        "budget_exceeded",
        "failed",
        "cancelled",
        "a_status_added_later",
    ],
)
@pytest.mark.parametrize("proposals", [[], [WEATHER]])
def test_interactions_only_requires_action_or_completed_is_read(
    status: str, proposals: list[ProposedCall]
) -> None:
    response = inbound("gemini-interactions", proposals)
    response["status"] = status
    error = refused("gemini-interactions", response)
    assert error.code == "invalid_provider_envelope"
    assert status in error.message


def test_interactions_without_status_are_read_only_on_opt_in() -> None:
    response = inbound("gemini-interactions", [WEATHER, STOCK])
    del response["status"]
    assert refused("gemini-interactions", response).code == "invalid_provider_envelope"
    read = read_proposals("gemini-interactions", response, KNOWN, allow_missing_stop_reason=True)
    assert read == [WEATHER, STOCK]


# --- Gemini GenerateContent ----------------------------------------------------------------


def gemini(finish: object, proposals: list[ProposedCall]) -> dict[str, Any]:
    response: dict[str, Any] = inbound("gemini-generate-content", proposals)
    candidate = response["candidates"][0]
    if finish is None:
        del candidate["finishReason"]
    else:
        candidate["finishReason"] = finish
    return response


@pytest.mark.parametrize(
    "finish", ["MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"]
)
@pytest.mark.parametrize("proposals", [[], [WEATHER]])
def test_gemini_failed_calls_are_malformed(finish: str, proposals: list[ProposedCall]) -> None:
    assert refused("gemini-generate-content", gemini(finish, proposals)).code == (
        "malformed_tool_calls"
    )


@pytest.mark.parametrize(
    "finish", ["CONTINUATION", "MALFORMED_RESPONSE", "MISSING_THOUGHT_SIGNATURE"]
)
@pytest.mark.parametrize("proposals", [[], [WEATHER, STOCK]])
def test_gemini_candidates_that_are_no_answer_are_refused(
    finish: str, proposals: list[ProposedCall]
) -> None:
    error = refused("gemini-generate-content", gemini(finish, proposals))
    assert error.code == "invalid_provider_envelope"
    assert finish in error.message


@pytest.mark.parametrize(
    "finish", ["MAX_TOKENS", "SAFETY", "RECITATION", "OTHER", "BLOCKLIST", "A_REASON_ADDED_LATER"]
)
def test_gemini_calls_in_a_candidate_that_stopped_early_are_refused(finish: str) -> None:
    error = refused("gemini-generate-content", gemini(finish, [WEATHER, STOCK]))
    assert error.code == "invalid_provider_envelope"
    assert finish in error.message and "cut off" in error.message


@pytest.mark.parametrize("finish", ["MAX_TOKENS", "SAFETY", "RECITATION"])
def test_gemini_a_candidate_that_stopped_early_without_calls_is_a_final_answer(
    finish: str,
) -> None:
    assert read_proposals("gemini-generate-content", gemini(finish, []), KNOWN) == []


@pytest.mark.parametrize("finish", ["STOP", "FINISH_REASON_UNSPECIFIED"])
def test_gemini_calls_in_a_finished_candidate_are_read(finish: str) -> None:
    response = gemini(finish, [WEATHER, STOCK])
    assert read_proposals("gemini-generate-content", response, KNOWN) == [WEATHER, STOCK]


def test_gemini_finish_reason_that_is_not_text_is_refused() -> None:
    error = refused("gemini-generate-content", gemini(["STOP"], [WEATHER]))
    assert error.code == "invalid_provider_envelope"


@pytest.mark.parametrize("finish", ["MAX_TOKENS", "CONTINUATION"])
def test_gemini_stream_whose_last_chunk_stopped_early_is_refused(finish: str) -> None:
    parts = inbound("gemini-generate-content", [WEATHER])["candidates"][0]["content"]["parts"]
    chunks = [{"candidates": [{"content": {"role": "model", "parts": [part]}}]} for part in parts]
    chunks.append({"candidates": [{"content": {"parts": []}, "finishReason": finish}]})
    error = refused("gemini-generate-content", chunks, stream=True)
    assert error.code == "invalid_provider_envelope"


# --- Anthropic Messages --------------------------------------------------------------------


@pytest.mark.parametrize("stop", ["max_tokens", "model_context_window_exceeded", "refusal"])
def test_anthropic_tool_use_in_a_cut_off_message_is_refused(stop: str) -> None:
    response = inbound("anthropic-messages", [WEATHER, STOCK])
    response["stop_reason"] = stop
    error = refused("anthropic-messages", response)
    assert error.code == "invalid_provider_envelope"
    assert "cut off" in error.message and stop in error.message


@pytest.mark.parametrize("stop", ["max_tokens", "end_turn", "stop_sequence"])
def test_anthropic_a_message_without_tool_use_is_a_final_answer(stop: str) -> None:
    response = inbound("anthropic-messages", [])
    response["stop_reason"] = stop
    assert read_proposals("anthropic-messages", response, KNOWN) == []


def anthropic_stream(*pieces: str, stop_reason: str, stop_block: bool) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1", "content": [], "stop_reason": None}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {}},
        },
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": piece},
        }
        for piece in pieces
    ]
    if stop_block:
        events.append({"type": "content_block_stop", "index": 0})
    events += [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}},
        {"type": "message_stop"},
    ]
    return events


@pytest.mark.parametrize("stop_block", [True, False])
@pytest.mark.parametrize("pieces", [('{"city": "Seoul"}',), ('{"city": "Se',)])
def test_anthropic_stream_cut_off_after_a_tool_use_block_is_refused(
    pieces: tuple[str, ...], stop_block: bool
) -> None:
    # Whether or not the truncated input happens to parse, and whether or not the block
    # was closed, the fault reported is the cut-off, never "bad JSON" or a read call.
    events = anthropic_stream(*pieces, stop_reason="max_tokens", stop_block=stop_block)
    error = refused("anthropic-messages", events, stream=True)
    assert error.code == "invalid_provider_envelope"
    assert "cut off" in error.message
    finished = anthropic_stream('{"city": "Seoul"}', stop_reason="tool_use", stop_block=True)
    assert read_stream("anthropic-messages", finished, KNOWN) == [WEATHER]


# --- OpenAI Chat Completions ---------------------------------------------------------------


@pytest.mark.parametrize("finish", ["length", "content_filter"])
def test_chat_tool_calls_in_a_cut_off_message_are_refused(finish: str) -> None:
    response = inbound("openai-chat", [WEATHER, STOCK])
    response["choices"][0]["finish_reason"] = finish
    error = refused("openai-chat", response)
    assert error.code == "invalid_provider_envelope"
    assert "cut off" in error.message and finish in error.message
    # truncated arguments are reported as the cut-off too, not as invalid JSON
    truncated = copy.deepcopy(response)
    truncated["choices"][0]["message"]["tool_calls"][-1]["function"]["arguments"] = '{"sym'
    assert refused("openai-chat", truncated).code == "invalid_provider_envelope"


@pytest.mark.parametrize("finish", ["length", "content_filter", "stop"])
def test_chat_a_message_without_tool_calls_is_a_final_answer(finish: str) -> None:
    response = inbound("openai-chat", [])
    response["choices"][0]["finish_reason"] = finish
    assert read_proposals("openai-chat", response, KNOWN) == []


def test_chat_tool_calls_with_finish_reason_stop_are_read() -> None:
    # A forced tool_choice ends with "stop", not "tool_calls": that is a complete call.
    response = inbound("openai-chat", [WEATHER])
    response["choices"][0]["finish_reason"] = "stop"
    assert read_proposals("openai-chat", response, KNOWN) == [WEATHER]


def test_chat_stream_cut_off_by_length_is_refused() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": '{"ci'}}
    events = [chunk({"tool_calls": [call]}), chunk({}, finish="length")]
    error = refused("openai-chat", events, stream=True)
    assert error.code == "invalid_provider_envelope"
    assert "cut off" in error.message


# --- A null stop/finish reason: an SDK helper's snapshot of a cut-off stream --------------

# Where each surface says why it stopped, as (path to the holder, key).
REASONS: dict[str, tuple[tuple[str | int, ...], str]] = {
    "openai-chat": (("choices", 0), "finish_reason"),
    "openai-responses": ((), "status"),
    "anthropic-messages": ((), "stop_reason"),
    "gemini-generate-content": (("candidates", 0), "finishReason"),
    "gemini-interactions": ((), "status"),
}


def with_reason(surface: str, proposals: list[ProposedCall], reason: object) -> Any:
    response = inbound(surface, proposals)
    holder, key = REASONS[surface]
    node = response
    for step in holder:
        node = node[step]
    if reason is _ABSENT:
        del node[key]
    else:
        node[key] = reason
    return response


_ABSENT = object()


@pytest.mark.parametrize("proposals", [[WEATHER, STOCK], []], ids=["calls", "no-calls"])
@pytest.mark.parametrize("surface", list(REASONS))
def test_a_null_stop_reason_is_refused_on_every_surface(
    surface: str, proposals: list[ProposedCall]
) -> None:
    # What openai's get_final_completion() and anthropic's get_final_message() return for a
    # stream cut off mid-way: the calls so far (the last one truncated), a null reason.
    error = refused(surface, with_reason(surface, proposals, None))
    assert error.code == "invalid_provider_envelope"
    assert "null" in error.message


# --- A missing stop/finish reason: a stream accumulated by hand or by a proxy ------------


@pytest.mark.parametrize("proposals", [[WEATHER, STOCK], []], ids=["calls", "no-calls"])
@pytest.mark.parametrize("surface", list(REASONS))
def test_a_response_without_a_stop_reason_is_refused_on_every_surface(
    surface: str, proposals: list[ProposedCall]
) -> None:
    # A user's own loop (or a proxy) that joins a stream's chunks into a dict and stops when
    # the connection drops leaves the reason out: the calls so far, the last one maybe cut.
    error = refused(surface, with_reason(surface, proposals, _ABSENT))
    assert error.code == "invalid_provider_envelope"
    assert REASONS[surface][1] in error.message and "missing" in error.message


@pytest.mark.parametrize("surface", list(REASONS))
def test_a_hand_built_response_may_opt_in_to_a_missing_stop_reason(surface: str) -> None:
    response = with_reason(surface, [WEATHER, STOCK], _ABSENT)
    read = read_proposals(surface, response, KNOWN, allow_missing_stop_reason=True)
    assert read == [WEATHER, STOCK]
    final = with_reason(surface, [], _ABSENT)
    assert read_proposals(surface, final, KNOWN, allow_missing_stop_reason=True) == []


@pytest.mark.parametrize("surface", list(REASONS))
def test_the_opt_in_never_reads_a_null_stop_reason(surface: str) -> None:
    # Null is an SDK's own word that the response never finished: no opt-in overrides it.
    response = with_reason(surface, [WEATHER], None)
    with pytest.raises(AdapterError) as caught:
        read_proposals(surface, response, KNOWN, allow_missing_stop_reason=True)
    assert caught.value.code == "invalid_provider_envelope" and "null" in caught.value.message


def test_chat_a_bare_assistant_message_says_nothing_about_finishing() -> None:
    message = inbound("openai-chat", [WEATHER])["choices"][0]["message"]
    error = refused("openai-chat", message)
    assert error.code == "invalid_provider_envelope" and "finish_reason" in error.message
    assert read_proposals("openai-chat", message, KNOWN, allow_missing_stop_reason=True) == [
        WEATHER
    ]
    # the compact choice states its reason and is read as it stands
    compact = {"finish_reason": "tool_calls", "message": message}
    assert read_proposals("openai-chat", compact, KNOWN) == [WEATHER]


def test_gemini_a_candidate_without_a_reason_in_either_spelling_is_refused() -> None:
    response = with_reason("gemini-generate-content", [WEATHER], _ABSENT)
    assert refused("gemini-generate-content", response).code == "invalid_provider_envelope"
    response["candidates"][0]["finish_reason"] = "STOP"  # the SDK's snake_case spelling
    assert read_proposals("gemini-generate-content", response, KNOWN) == [WEATHER]


@pytest.mark.parametrize(
    ("surface", "event"),
    [
        ("openai-responses", lambda r: {"type": "response.completed", "response": r}),
        (
            "gemini-interactions",
            lambda r: {"event_type": "interaction.completed", "interaction": r},
        ),
    ],
)
def test_a_stream_whose_terminal_event_carries_no_status_is_refused(
    surface: str, event: Any
) -> None:
    # The terminal event carries the whole response; without its status it is the same
    # hand-joined dict as above, and the stream gives the same error as the response.
    events = [event(with_reason(surface, [WEATHER], _ABSENT))]
    error = refused(surface, events, stream=True)
    assert error.code == "invalid_provider_envelope" and "missing" in error.message


def test_gemini_snake_case_null_finish_reason_is_refused() -> None:
    response = inbound("gemini-generate-content", [WEATHER])
    candidate = response["candidates"][0]
    del candidate["finishReason"]
    candidate["finish_reason"] = None
    assert refused("gemini-generate-content", response).code == "invalid_provider_envelope"


def test_sdk_objects_without_a_stop_reason_are_refused() -> None:
    # Read from the SDK object itself: dumping it without nulls would hide the missing reason.
    anthropic = pytest.importorskip("anthropic.types")
    openai = pytest.importorskip("openai.types.chat")
    genai = pytest.importorskip("google.genai.types")
    raw_message = {
        **inbound("anthropic-messages", [WEATHER]),
        "model": "claude",
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    message = anthropic.Message.model_validate(raw_message)
    assert read_proposals("anthropic-messages", message, KNOWN) == [WEATHER]
    message.stop_reason = None
    assert refused("anthropic-messages", message).code == "invalid_provider_envelope"
    raw_completion = {**inbound("openai-chat", [WEATHER]), "created": 1, "model": "gpt"}
    completion = openai.ChatCompletion.model_validate(raw_completion)
    assert read_proposals("openai-chat", completion, KNOWN) == [WEATHER]
    completion.choices[0].finish_reason = None  # type: ignore[assignment]
    assert refused("openai-chat", completion).code == "invalid_provider_envelope"
    # a stream chunk: google-genai leaves finish_reason None on every chunk but the last
    chunk = genai.GenerateContentResponse.model_validate(
        with_reason("gemini-generate-content", [WEATHER], _ABSENT)
    )
    assert refused("gemini-generate-content", chunk).code == "invalid_provider_envelope"


@pytest.mark.parametrize("surface", list(REASONS))
def test_the_cli_and_api_intake_refuses_a_response_without_a_stop_reason(surface: str) -> None:
    # `callgate submit --provider` and `POST /v1/turns?provider=` read through this one
    # function, with no opt-in: their body states its reason.
    from callgate.producer import intake

    response = with_reason(surface, [WEATHER], _ABSENT)
    with pytest.raises(AdapterError) as caught:
        intake.proposals_from(response, provider=surface, stream=False, known_tools=KNOWN)
    assert caught.value.code == "invalid_provider_envelope"
    stated = with_reason(surface, [WEATHER], REASONS_GIVEN[surface])
    assert intake.proposals_from(stated, provider=surface, stream=False, known_tools=KNOWN) == [
        WEATHER
    ]


REASONS_GIVEN = {
    "openai-chat": "tool_calls",
    "openai-responses": "completed",
    "anthropic-messages": "tool_use",
    "gemini-generate-content": "STOP",
    "gemini-interactions": "requires_action",
}
