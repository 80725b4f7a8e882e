"""Streams: reassemble chunks or events into the surface's whole response, then read that.

Reassembly only rebuilds the envelope; the surface's own reader does every check, so a
stream and the equivalent whole response give the same proposals or the same error. A stream
that ends before the surface's stop signal is refused (``invalid_provider_envelope``): a call
cut off mid-stream must never run. So is one whose stop signal says the output was cut off
(``length``, ``max_tokens``, ``MAX_TOKENS`` …) while it holds calls: the reader checks that.

- ``openai-chat``: ``chat.completion.chunk`` deltas; ``tool_calls[].index`` joins the pieces
  of one call (name and arguments text are concatenated in arrival order; the id comes once).
  The events of the SDK's ``chat.completions.stream()`` helper are read too: each ``chunk``
  event's ``chunk``; the events it derives from them (``content.delta``,
  ``tool_calls.function.arguments.done`` …) add nothing and are skipped.
- ``anthropic-messages``: ``content_block_start`` / ``input_json_delta`` /
  ``content_block_stop``; a ``tool_use`` block's ``partial_json`` pieces are joined and parsed
  as its input (an empty buffer keeps the start event's input, ``{}`` for a no-argument tool).
- ``openai-responses``: the terminal ``response.completed`` (or ``.incomplete``/``.failed``)
  event carries the whole response; it is read as is (so only a completed one gives calls).
- ``gemini-generate-content``: each chunk is a partial response; the parts of all chunks are
  concatenated. Function calls arrive whole, except with Vertex AI's streamed arguments
  (``partialArgs``, ``willContinue``), which are put back together first
  (``callgate.producer.adapters.gemini_partial_args``).
- ``gemini-interactions``: ``step.start`` / ``step.delta`` / ``step.stop`` events by
  ``index``; a ``function_call`` step's ``arguments_delta`` pieces are joined and parsed as
  its arguments (no pieces: the start event's arguments). The terminal
  ``interaction.completed`` event gives the status (its ``steps``, when it carries them, are
  read as they are). An ``error`` event, or no ``interaction.completed``, is refused.

SDK stream helpers also hand out an accumulated snapshot (``get_final_message()``,
``get_final_completion()``); for a stream cut off mid-way its stop reason is null, and
``read_proposals`` refuses it rather than run its truncated calls. A snapshot joined by the
application's own code or a proxy leaves the reason out instead; refused the same way. The
terminal event's response or interaction must carry its status too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import callgate.producer.adapters.anthropic_messages as anthropic_messages
import callgate.producer.adapters.gemini_generate_content as gemini_generate_content
import callgate.producer.adapters.gemini_interactions as gemini_interactions
import callgate.producer.adapters.openai_chat as openai_chat
import callgate.producer.adapters.openai_responses as openai_responses
from callgate.core.errors import ErrorCode
from callgate.core.types import ProposedCall
from callgate.producer.adapters.base import arr, fail, get, obj, to_plain
from callgate.producer.adapters.gemini_partial_args import PartialCalls


def _events(events: object) -> list[dict[str, object]]:
    if isinstance(events, str | bytes | bytearray):
        events = to_plain(events)
    if isinstance(events, dict) or not isinstance(events, Iterable):
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "a stream is a sequence of events")
    return [
        obj(to_plain(event), ErrorCode.INVALID_PROVIDER_ENVELOPE, "a stream event", f"[{n}]")
        for n, event in enumerate(events)
    ]


def _index(value: object, at: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        fail(ErrorCode.MALFORMED_TOOL_CALLS, "a streamed tool call has no valid index", at)
    return value


def _piece(value: object, at: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "a streamed tool call piece is not text", at)
    return value


# Events of openai's chat.completions.stream() helper derived from the chunks it wraps in its
# "chunk" events: reading them as well would count every piece twice.
_CHAT_DERIVED = frozenset(
    {
        "content.delta",
        "content.done",
        "refusal.delta",
        "refusal.done",
        "tool_calls.function.arguments.delta",
        "tool_calls.function.arguments.done",
        "logprobs.content.delta",
        "logprobs.content.done",
        "logprobs.refusal.delta",
        "logprobs.refusal.done",
    }
)


def _chat_chunks(events: list[dict[str, object]]) -> list[tuple[int, dict[str, object]]]:
    """(event number, chunk) for raw chunks and the helper's ``chunk`` events alike."""
    chunks: list[tuple[int, dict[str, object]]] = []
    for n, event in enumerate(events):
        kind = event.get("type")
        if kind == "chunk" and "chunk" in event:
            chunk = event["chunk"]
            chunks.append((n, obj(chunk, ErrorCode.INVALID_PROVIDER_ENVELOPE, "chunk", f"[{n}]")))
        elif not (isinstance(kind, str) and kind in _CHAT_DERIVED):
            chunks.append((n, event))
    return chunks


def _openai_chat(events: list[dict[str, object]]) -> dict[str, Any]:
    slots: dict[int, dict[str, Any]] = {}
    finish: object = None
    for n, chunk in _chat_chunks(events):
        if chunk.get("error") is not None:
            fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream carried an error", f"[{n}]")
        choices = arr(
            chunk.get("choices", []), ErrorCode.INVALID_PROVIDER_ENVELOPE, "choices", f"[{n}]"
        )
        for raw_choice in choices:
            choice = obj(raw_choice, ErrorCode.INVALID_PROVIDER_ENVELOPE, "a choice", f"[{n}]")
            if choice.get("index", 0) != 0:
                fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "a stream with n > 1 choices", f"[{n}]")
            delta = obj(
                choice.get("delta") or {}, ErrorCode.INVALID_PROVIDER_ENVELOPE, "delta", f"[{n}]"
            )
            if delta.get("function_call") is not None:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "the legacy function_call carries no id")
            raw_calls = delta.get("tool_calls") or []
            for raw in arr(raw_calls, ErrorCode.MALFORMED_TOOL_CALLS, "tool_calls", f"[{n}]"):
                _merge_chat_delta(
                    slots,
                    obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "a tool call", f"[{n}]"),
                    f"[{n}]",
                )
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
    if finish is None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream ended before a finish_reason")
    message: dict[str, Any] = {"role": "assistant"}
    if slots:
        message["tool_calls"] = [slots[index] for index in sorted(slots)]
    return {"finish_reason": finish, "message": message}


def _merge_chat_delta(slots: dict[int, dict[str, Any]], delta: dict[str, object], at: str) -> None:
    index = _index(delta.get("index"), at)
    slot = slots.setdefault(index, {"type": "function", "function": {"name": "", "arguments": ""}})
    call_id = delta.get("id")
    if call_id is not None:
        if "id" in slot and slot["id"] != call_id:
            fail(ErrorCode.MALFORMED_TOOL_CALLS, "one streamed tool call has two ids", at)
        slot["id"] = call_id
    if delta.get("type") is not None:
        slot["type"] = delta["type"]
    if delta.get("custom") is not None:
        # Kept only so the reader can refuse it by name.
        custom = delta["custom"]
        slot["type"] = "custom"
        slot["custom"] = custom if isinstance(custom, dict) else {}
    function = delta.get("function")
    if function is not None:
        pieces = obj(function, ErrorCode.MALFORMED_TOOL_CALLS, "function", at)
        slot["function"]["name"] += _piece(pieces.get("name"), at)
        slot["function"]["arguments"] += _piece(pieces.get("arguments"), at)


def _anthropic(events: list[dict[str, object]]) -> dict[str, Any]:
    blocks: dict[int, dict[str, object]] = {}
    buffers: dict[int, list[str]] = {}
    stopped: set[int] = set()
    stop_reason: object = None
    for n, event in enumerate(events):
        at = f"[{n}]"
        kind = event.get("type")
        if kind == "error":
            fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream carried an error", at)
        elif kind == "content_block_start":
            index = _index(event.get("index"), at)
            if index in blocks:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a content block started twice", at)
            blocks[index] = obj(
                event.get("content_block"), ErrorCode.MALFORMED_TOOL_CALLS, "content_block", at
            )
            buffers[index] = []
        elif kind == "content_block_delta":
            index = _index(event.get("index"), at)
            if index not in blocks or index in stopped:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a delta for a block that is not open", at)
            delta = obj(event.get("delta"), ErrorCode.MALFORMED_TOOL_CALLS, "delta", at)
            if delta.get("type") == "input_json_delta":
                buffers[index].append(_piece(delta.get("partial_json"), at))
        elif kind == "content_block_stop":
            index = _index(event.get("index"), at)
            if index not in blocks:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a stop for a block never started", at)
            stopped.add(index)
        elif kind == "message_delta":
            delta = obj(event.get("delta") or {}, ErrorCode.INVALID_PROVIDER_ENVELOPE, "delta", at)
            if delta.get("stop_reason") is not None:
                stop_reason = delta["stop_reason"]
    if stop_reason is None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream ended before a stop_reason")
    # Before the block checks below: a tool_use block cut off by max_tokens may never have
    # stopped, and "cut off" is the fault to report.
    anthropic_messages.refuse_cut_off(stop_reason, list(blocks.values()))
    content: list[dict[str, object]] = []
    for index in sorted(blocks):
        block = dict(blocks[index])
        if block.get("type") == "tool_use":
            if index not in stopped:
                fail(
                    ErrorCode.MALFORMED_TOOL_CALLS,
                    "a tool_use block never stopped",
                    f"content[{index}]",
                )
            text = "".join(buffers[index])
            if text:
                block["input"] = text  # parsed, or refused as invalid_arguments_json, by the reader
        content.append(block)
    return {"role": "assistant", "content": content, "stop_reason": stop_reason}


def _openai_responses(events: list[dict[str, object]]) -> object:
    final: object = None
    for n, event in enumerate(events):
        kind = event.get("type")
        if kind == "error":
            fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream carried an error", f"[{n}]")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = event.get("response")
    if final is None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream ended before response.completed")
    return final


def _gemini(events: list[dict[str, object]]) -> dict[str, Any]:
    parts: list[object] = []
    streamed = PartialCalls()
    finish: object = None
    for n, chunk in enumerate(events):
        if chunk.get("error") is not None:
            fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream carried an error", f"[{n}]")
        if chunk.get("candidates") is None:
            continue  # a usage-only chunk
        candidates = arr(
            chunk["candidates"], ErrorCode.INVALID_PROVIDER_ENVELOPE, "candidates", f"[{n}]"
        )
        if len(candidates) != 1:
            fail(
                ErrorCode.INVALID_PROVIDER_ENVELOPE,
                "a stream chunk without exactly one candidate",
                f"[{n}]",
            )
        candidate = obj(candidates[0], ErrorCode.INVALID_PROVIDER_ENVELOPE, "a candidate", f"[{n}]")
        content = candidate.get("content")
        if content is not None:
            content = obj(content, ErrorCode.INVALID_PROVIDER_ENVELOPE, "content", f"[{n}]")
            chunk_parts = get(content, "parts")
            if chunk_parts is not None:
                items = arr(chunk_parts, ErrorCode.MALFORMED_TOOL_CALLS, "parts", f"[{n}]")
                for index, part in enumerate(items):
                    parts.extend(streamed.part(part, f"[{n}].content.parts[{index}]"))
        reason = get(candidate, "finishReason", "finish_reason")
        if reason is not None:
            finish = reason
    if finish is None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream ended before a finishReason")
    streamed.finish()
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish}]}


def _interactions(events: list[dict[str, object]]) -> dict[str, object]:
    steps: dict[int, dict[str, object]] = {}
    buffers: dict[int, list[str]] = {}
    stopped: set[int] = set()
    final: dict[str, object] | None = None
    for n, event in enumerate(events):
        at = f"[{n}]"
        kind = event.get("event_type")
        if kind == "error":
            fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream carried an error", at)
        elif kind == "step.start":
            index = _index(event.get("index"), at)
            if index in steps:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a step started twice", at)
            steps[index] = obj(event.get("step"), ErrorCode.MALFORMED_TOOL_CALLS, "step", at)
            buffers[index] = []
        elif kind == "step.delta":
            index = _index(event.get("index"), at)
            if index not in steps or index in stopped:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a delta for a step that is not open", at)
            delta = obj(event.get("delta"), ErrorCode.MALFORMED_TOOL_CALLS, "delta", at)
            if delta.get("type") == "arguments_delta":
                buffers[index].append(_piece(delta.get("arguments"), at))
        elif kind == "step.stop":
            if _index(event.get("index"), at) not in steps:
                fail(ErrorCode.MALFORMED_TOOL_CALLS, "a stop for a step never started", at)
            stopped.add(_index(event.get("index"), at))
        elif kind == "interaction.completed":
            final = obj(
                event.get("interaction"), ErrorCode.INVALID_PROVIDER_ENVELOPE, "interaction", at
            )
    if final is None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the stream ended before interaction.completed")
    if final.get("steps") is not None:
        return final  # the whole interaction, as the server sent it
    whole: list[dict[str, object]] = []
    for index in sorted(steps):
        step = dict(steps[index])
        if step.get("type") == "function_call":
            if index not in stopped:
                fail(
                    ErrorCode.MALFORMED_TOOL_CALLS,
                    "a function_call step never stopped",
                    f"steps[{index}]",
                )
            text = "".join(buffers[index])
            if text:
                step["arguments"] = text  # parsed, or refused as invalid_arguments_json
        whole.append(step)
    return {**final, "steps": whole}


def read_stream(surface: str, events: object, known_tools: frozenset[str]) -> list[ProposedCall]:
    """Proposals from a stream of ``surface`` events; the surface must support streams."""
    if surface == "openai-chat":
        return openai_chat.read(_openai_chat(_events(events)), known_tools)
    if surface == "anthropic-messages":
        return anthropic_messages.read(_anthropic(_events(events)), known_tools)
    if surface == "openai-responses":
        return openai_responses.read(_openai_responses(_events(events)), known_tools)
    if surface == "gemini-generate-content":
        return gemini_generate_content.read(_gemini(_events(events)), known_tools)
    if surface == "gemini-interactions":
        return gemini_interactions.read(_interactions(_events(events)), known_tools)
    fail(ErrorCode.UNSUPPORTED_SURFACE, f"streams are not supported for {surface!r}")
