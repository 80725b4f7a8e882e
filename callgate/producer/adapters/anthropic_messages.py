"""Anthropic Messages: ``tool_use`` content blocks in, ``tool_result`` blocks out.

Text and thinking blocks beside tool blocks are skipped, never allowed to hide them.
``server_tool_use`` and the other provider-run blocks (web search, code execution, MCP
connector) are the provider's to execute and are skipped. A ``tool_use`` the model made from
inside code execution (``caller.type`` other than ``direct``) still waits for an application
result, so it is read like any other. ``stop_reason: tool_use`` with no ``tool_use`` block is
``missing_tool_calls``; ``tool_use`` blocks under a stop reason that cut the message off
(``max_tokens``, ``model_context_window_exceeded``, ``refusal``) are refused, and so is a
message whose ``stop_reason`` is null (the SDK's ``messages.stream(...).get_final_message()``
returns one for a stream cut off mid-way, its last input already parsed from truncated JSON:
a cut-off ``"amount": 1000`` reads as ``1``) or missing (the same stream joined by hand or by
a proxy; read only when the caller vouches for a message it built,
``allow_missing_stop_reason``). Results go back as one ``user`` message; failures set
``is_error``.
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

SURFACE = "anthropic-messages"
_decode = partial(names.tool_name, SURFACE)
# Stop reasons that end generation mid-message: a tool_use block under one may be truncated
# (its input cut short, or the calls after it never emitted). ``refusal`` is included because
# a streaming classifier stops the output wherever it is.
_CUT_OFF = ("max_tokens", "model_context_window_exceeded", "refusal")


def refuse_cut_off(stop_reason: object, content: list[object]) -> None:
    """Refuse ``tool_use`` blocks in a message that stopped before it was finished.

    Checked before any block is parsed, so a truncated input is reported as cut off rather
    than as bad JSON. A message without tool blocks is still a (truncated) final answer.
    """
    if stop_reason not in _CUT_OFF:
        return
    if any(isinstance(block, dict) and block.get("type") == "tool_use" for block in content):
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"the response was cut off (stop_reason {show(stop_reason)}) with tool_use blocks;"
            " a cut-off call is never read as complete",
            "stop_reason",
        )


def read(
    response: object, known_tools: frozenset[str], *, allow_missing_stop_reason: bool = False
) -> list[ProposedCall]:
    """Every ``tool_use`` block of the message, in content order."""
    root = obj(response, ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response", "$")
    if root.get("type") == "error" or root.get("error") is not None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response is an API error", "error")
    content = arr(root.get("content"), ErrorCode.INVALID_PROVIDER_ENVELOPE, "content", "content")
    require_reason(root, ("stop_reason",), "stop_reason", allow_missing=allow_missing_stop_reason)
    refuse_cut_off(root.get("stop_reason"), content)
    proposals: list[ProposedCall] = []
    for index, raw in enumerate(content):
        at = f"content[{index}]"
        block = obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "a content block", at)
        if block.get("type") != "tool_use":
            continue
        if "input" not in block:
            fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "a tool_use block has no input", f"{at}.input")
        proposals.append(
            proposal(
                block.get("id"),
                block.get("name"),
                block.get("input"),
                path=at,
                known_tools=known_tools,
                decode_name=_decode,
            )
        )
    if root.get("stop_reason") == "tool_use" and not proposals:
        fail(ErrorCode.MISSING_TOOL_CALLS, "stop_reason is tool_use but no tool_use block")
    return unique(proposals)


def write(proposals: list[ProposedCall], results: list[Result]) -> dict[str, Any]:
    """One ``user`` message holding a ``tool_result`` block per result."""
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": result.call_id,
                "is_error": is_error(result),
                "content": body_text(result),
            }
            for result in results
        ],
    }


def tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "name": names.wire_name(SURFACE, spec.name),
            "description": spec.description,
            "input_schema": spec.parameters,
        }
        for spec in specs
    ]
