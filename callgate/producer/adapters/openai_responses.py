"""OpenAI Responses: ``output[]`` ``function_call`` items in, ``function_call_output`` out.

Correlation is by ``call_id`` (an item's ``id`` is the item's own id, not the call's). Items
callgate does not run are skipped: messages, reasoning, and provider-hosted tool calls
(web search, file search, code interpreter, MCP …). Items that *do* wait for an application
result but are not JSON-Schema functions (custom, computer, shell, apply-patch calls, MCP
approval requests, client-side tool search) are refused by name with
``invalid_tool_call_field`` rather than dropped: dropping them would leave the conversation
waiting for an output that never comes. A call already answered by an ``*_output`` item in
the same output is not proposed again.

Only a finished response is read: a ``status`` other than ``completed`` (``in_progress``,
``queued``, ``incomplete``, ``cancelled``, ``failed``) is ``invalid_provider_envelope``, so
a background response still running is never taken for "no calls" and a truncated one never
for a complete call list. A null ``status`` (or an SDK object without one) is refused, and so
is a dict without ``status`` unless the caller vouches for it (``allow_missing_stop_reason``).
A
``function_call`` item that is not ``completed`` (cut off mid-generation) is refused too.
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

SURFACE = "openai-responses"
_decode = partial(names.tool_name, SURFACE)

# Output items that wait for an application-side result callgate cannot produce.
_REFUSED = frozenset(
    {
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_approval_request",
    }
)


def _answered(items: list[object]) -> set[str]:
    answered: set[str] = set()
    for item in items:
        if not isinstance(item, dict):
            continue
        # str() of a model-controlled value could raise (huge ints, deep nesting): test type.
        kind, call_id = item.get("type"), item.get("call_id")
        if isinstance(kind, str) and kind.endswith("_output") and isinstance(call_id, str):
            answered.add(call_id)
    return answered


def read(
    response: object, known_tools: frozenset[str], *, allow_missing_stop_reason: bool = False
) -> list[ProposedCall]:
    """Every unanswered ``function_call`` item of the response, in output order."""
    root = obj(response, ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response", "$")
    if root.get("error") is not None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response failed", "error")
    require_reason(root, ("status",), "status", allow_missing=allow_missing_stop_reason)
    status = root.get("status")
    if status is not None and status != "completed":
        # in_progress/queued (background mode) hold no calls yet, incomplete ones were cut
        # off, failed/cancelled ones never finished: none is a final answer or a call list.
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"the response is not finished (status {show(status)}); only a completed response"
            " can be read",
            "status",
        )
    if "output" not in root:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "not a Responses response: no output")
    items = arr(root["output"], ErrorCode.INVALID_PROVIDER_ENVELOPE, "output", "output")
    answered = _answered(items)
    proposals: list[ProposedCall] = []
    for index, raw in enumerate(items):
        at = f"output[{index}]"
        item = obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "an output item", at)
        kind = item.get("type")
        call_id = item.get("call_id")
        if isinstance(call_id, str) and call_id in answered:
            continue
        refused = (isinstance(kind, str) and kind in _REFUSED) or (
            kind == "tool_search_call" and item.get("execution") == "client"
        )
        if refused:
            fail(
                ErrorCode.INVALID_TOOL_CALL_FIELD,
                f"{kind} item {show(item.get('name'))} is not supported: callgate runs"
                " JSON-Schema function tools only",
                f"{at}.type",
            )
        if kind != "function_call":
            continue
        if item.get("status") not in (None, "completed"):
            fail(
                ErrorCode.INVALID_TOOL_CALL_FIELD,
                f"the function call is not complete (status {show(item.get('status'))})",
                f"{at}.status",
            )
        proposals.append(
            proposal(
                call_id,
                item.get("name"),
                item.get("arguments"),
                path=at,
                known_tools=known_tools,
                decode_name=_decode,
            )
        )
    return unique(proposals)


def write(proposals: list[ProposedCall], results: list[Result]) -> list[dict[str, Any]]:
    """One ``function_call_output`` input item per result, keyed by ``call_id``."""
    return [
        {"type": "function_call_output", "call_id": result.call_id, "output": body_text(result)}
        for result in results
    ]


def tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    # strict is off: strict mode needs every property required and additionalProperties
    # false, which an arbitrary registry schema does not promise. The gate validates anyway.
    return [
        {
            "type": "function",
            "name": names.wire_name(SURFACE, spec.name),
            "description": spec.description,
            "parameters": spec.parameters,
            "strict": False,
        }
        for spec in specs
    ]
