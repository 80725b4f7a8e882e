"""OpenAI Chat Completions: ``message.tool_calls[]`` in, ``role: tool`` messages out.

Accepted envelopes: a whole completion (``{choices: [...]}`` with exactly one choice — with
``n > 1`` pass the choice you continue with), one choice (``{finish_reason, message}``, the
compact form), or the assistant message itself. A ``finish_reason`` that is null (an SDK
stream accumulator's snapshot of a cut-off stream) or missing (a stream joined by hand or
by a proxy) is refused; the bare message carries none, so it is read only when the caller
vouches for it (``allow_missing_stop_reason=True``): prefer the completion.
``finish_reason: tool_calls`` only says proposals are here; it never means anything ran.
Tool calls under ``finish_reason`` ``length`` or ``content_filter`` were cut off and are
refused (``invalid_provider_envelope``).

Custom tool calls (``type: custom``, free-text ``input`` checked by a grammar, not a JSON
Schema) are refused by name with ``invalid_tool_call_field``: callgate's gate validates
arguments against a JSON Schema, and it will not guess an object around free text. The
legacy single ``function_call`` (no call id to correlate by) is refused as
``malformed_tool_calls``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import callgate.producer.adapters.names as names
from callgate.core.errors import ErrorCode
from callgate.core.types import ProposedCall
from callgate.producer.adapters.base import (
    arr,
    fail,
    obj,
    proposal,
    require_reason,
    show,
    unique,
)
from callgate.producer.adapters.definitions import ToolSpec
from callgate.producer.adapters.results import Result, body_text

SURFACE = "openai-chat"
_decode = partial(names.tool_name, SURFACE)
# finish_reason values that stop generation mid-message, so tool calls may be truncated.
# ("stop" with tool calls is normal: a forced tool_choice ends that way.)
_CUT_OFF = ("length", "content_filter")


def _choice(root: dict[str, object]) -> tuple[dict[str, object], dict[str, object], str]:
    """(choice, message, path) from any of the three accepted envelope shapes."""
    if "choices" in root:
        choices = arr(root["choices"], ErrorCode.INVALID_PROVIDER_ENVELOPE, "choices", "choices")
        if len(choices) != 1:
            fail(
                ErrorCode.INVALID_PROVIDER_ENVELOPE,
                f"the completion has {len(choices)} choices; pass the one choice to continue",
                "choices",
            )
        choice = obj(choices[0], ErrorCode.INVALID_PROVIDER_ENVELOPE, "a choice", "choices[0]")
        path = "choices[0]"
    elif "message" in root:
        choice, path = root, "$"
    elif root.get("role") == "assistant":
        return {}, root, "$"
    else:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            "not a chat completion: no choices, message or assistant role",
        )
    message = obj(
        choice.get("message"), ErrorCode.INVALID_PROVIDER_ENVELOPE, "message", f"{path}.message"
    )
    return choice, message, f"{path}.message"


def read(
    response: object, known_tools: frozenset[str], *, allow_missing_stop_reason: bool = False
) -> list[ProposedCall]:
    """Every function call the assistant message proposes, in the model's order."""
    root = obj(response, ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response", "$")
    if root.get("error") is not None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response is an API error", "error")
    choice, message, path = _choice(root)
    # A bare assistant message has no choice around it: its finish_reason is missing.
    require_reason(
        choice,
        ("finish_reason",),
        path.removesuffix("message") + "finish_reason",
        allow_missing=allow_missing_stop_reason,
    )
    finish = choice.get("finish_reason")
    asked = finish == "tool_calls"
    if message.get("function_call") is not None:
        fail(
            ErrorCode.MALFORMED_TOOL_CALLS,
            "the legacy function_call field carries no call id; use tools",
            f"{path}.function_call",
        )
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        if asked:
            fail(ErrorCode.MISSING_TOOL_CALLS, "finish_reason is tool_calls but there are none")
        return []
    calls = arr(raw_calls, ErrorCode.MALFORMED_TOOL_CALLS, "tool_calls", f"{path}.tool_calls")
    if asked and not calls:
        fail(ErrorCode.MISSING_TOOL_CALLS, "finish_reason is tool_calls but tool_calls is empty")
    if calls and finish in _CUT_OFF:
        # Checked before parsing: truncated arguments are "cut off", not "bad JSON".
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"the response was cut off (finish_reason {show(finish)}) with tool calls;"
            " a cut-off call is never read as complete",
            "finish_reason",
        )
    proposals: list[ProposedCall] = []
    for index, raw in enumerate(calls):
        at = f"{path}.tool_calls[{index}]"
        call = obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "a tool call", at)
        kind = call.get("type", "function")  # compact calls leave type out
        if kind == "custom":
            custom = call.get("custom")
            name = custom.get("name") if isinstance(custom, dict) else None
            fail(
                ErrorCode.INVALID_TOOL_CALL_FIELD,
                f"custom tool call {show(name)} is not supported: callgate runs JSON-Schema"
                " function tools only",
                f"{at}.type",
            )
        if kind != "function":
            fail(ErrorCode.INVALID_TOOL_CALL_FIELD, f"unknown tool call type {show(kind)}", at)
        function = obj(call.get("function"), ErrorCode.MALFORMED_TOOL_CALLS, "function", at)
        proposals.append(
            proposal(
                call.get("id"),
                function.get("name"),
                function.get("arguments"),
                path=at,
                known_tools=known_tools,
                decode_name=_decode,
            )
        )
    return unique(proposals)


def write(proposals: list[ProposedCall], results: list[Result]) -> list[dict[str, Any]]:
    """One ``role: tool`` message per result, keyed by ``tool_call_id``."""
    return [
        {"role": "tool", "tool_call_id": result.call_id, "content": body_text(result)}
        for result in results
    ]


def tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": names.wire_name(SURFACE, spec.name),
                "description": spec.description,
                "parameters": spec.parameters,
            },
        }
        for spec in specs
    ]
