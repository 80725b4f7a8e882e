"""Gemini Interactions: ``function_call`` steps in, ``function_result`` steps out.

Reads ``steps[]`` and skips every step that is not a function call (``thought``,
``model_output``, ``user_input``, provider-run tool steps). A call already answered by a
``function_result`` step in the same interaction is not proposed again. ``status:
requires_action`` with no pending call is ``missing_tool_calls``. Only ``requires_action``
and ``completed`` interactions are read (a dict without ``status`` only when the caller
vouches for it with ``allow_missing_stop_reason``); any other status, a null one or a missing
one is unfinished or cut off and refused with ``invalid_provider_envelope``.

A ``function_call`` step must carry its ``id``: the API always sends one, and the
``function_result`` must echo it as ``call_id``, so there is nothing to correlate a made-up
id with. An id-less step is ``invalid_tool_call_field`` (only GenerateContent gets synthetic
ids).

The older ``outputs`` shape is refused with ``invalid_provider_envelope`` and a message that
names it: reading it as "no steps, so no calls" would silently lose the calls.

Results go back as ``{"input": [function_result …]}`` with both ``name`` and ``call_id``,
which the result union carries, so no hidden id → name map is needed; they follow the
caller's order, each keyed by its id. This surface shares no fields with GenerateContent.
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
from callgate.producer.adapters.results import Result, body_text, is_error

SURFACE = "gemini-interactions"
_decode = partial(names.tool_name, SURFACE)
# Every other InteractionStatus (in_progress, queued, idle, requires_continuation, incomplete,
# budget_exceeded, failed, cancelled, and any the SDK adds later) is unfinished or cut off:
# its steps are neither a final answer nor a complete set of calls.
_READABLE = ("requires_action", "completed")


def _steps(root: dict[str, object], allow_missing_stop_reason: bool) -> list[object]:
    if root.get("outputs") is not None:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            "legacy Interactions shape: this interaction has `outputs`, not `steps`; callgate"
            " reads only `steps[]` (use a current google-genai / Interactions API version)",
            "outputs",
        )
    if root.get("error") is not None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the interaction failed", "error")
    require_reason(root, ("status",), "status", allow_missing=allow_missing_stop_reason)
    status = root.get("status")
    if status is not None and status not in _READABLE:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"the interaction is not finished (status {show(status)}); only requires_action"
            " or completed can be read",
            "status",
        )
    if root.get("steps") is None:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            "the interaction has no steps: cannot tell whether the model proposed calls",
            "steps",
        )
    return arr(root["steps"], ErrorCode.INVALID_PROVIDER_ENVELOPE, "steps", "steps")


def read(
    response: object, known_tools: frozenset[str], *, allow_missing_stop_reason: bool = False
) -> list[ProposedCall]:
    """Every unanswered ``function_call`` step, in step order."""
    root = obj(response, ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response", "$")
    steps = _steps(root, allow_missing_stop_reason)
    answered = {
        step.get("call_id")
        for step in steps
        if isinstance(step, dict)
        and step.get("type") == "function_result"
        and isinstance(step.get("call_id"), str)
    }
    proposals: list[ProposedCall] = []
    for index, raw in enumerate(steps):
        at = f"steps[{index}]"
        step = obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "a step", at)
        if step.get("type") != "function_call":
            continue
        call_id = step.get("id")
        if isinstance(call_id, str) and call_id in answered:
            continue
        if call_id is None or call_id == "":
            fail(
                ErrorCode.INVALID_TOOL_CALL_FIELD,
                "a function_call step has no id; its function_result must echo one as call_id",
                f"{at}.id",
            )
        proposals.append(
            proposal(
                call_id,
                step.get("name"),
                step.get("arguments"),
                path=at,
                known_tools=known_tools,
                decode_name=_decode,
                missing_arguments_is_empty=True,
            )
        )
    if root.get("status") == "requires_action" and not proposals:
        fail(ErrorCode.MISSING_TOOL_CALLS, "status is requires_action but no function_call step")
    return unique(proposals)


def write(proposals: list[ProposedCall], results: list[Result]) -> dict[str, Any]:
    """``{"input": [...]}``: one ``function_result`` step per result, text-wrapped body."""
    return {
        "input": [
            {
                "type": "function_result",
                "name": names.wire_name(SURFACE, result.tool_name, check_length=False),
                "call_id": result.call_id,
                "is_error": is_error(result),
                "result": [{"type": "text", "text": body_text(result)}],
            }
            for result in results
        ]
    }


def tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": names.wire_name(SURFACE, spec.name),
            "description": spec.description,
            "parameters": spec.parameters,
        }
        for spec in specs
    ]
