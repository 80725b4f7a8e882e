"""Gemini GenerateContent: ``functionCall`` parts in, ``functionResponse`` parts out.

Reads the REST spelling (camelCase) and the snake_case a google-genai object dumps to.
Parts that are text or thoughts are skipped, never allowed to hide the calls. Gemini has no
tool-call stop signal, but ``finishReason`` ``MALFORMED_FUNCTION_CALL``,
``UNEXPECTED_TOOL_CALL`` or ``TOO_MANY_TOOL_CALLS`` means the model tried to call and failed:
``malformed_tool_calls``. ``CONTINUATION``, ``MALFORMED_RESPONSE`` and
``MISSING_THOUGHT_SIGNATURE`` leave nothing to read (``invalid_provider_envelope``).
``functionCall`` parts are read only from a candidate that finished normally (``STOP``, or
no reason given when the caller vouches for it with ``allow_missing_stop_reason``); under
any other reason (``MAX_TOKENS``, ``SAFETY`` …) a call may be cut off and is refused, while a
candidate without calls is still a final answer. A null ``finishReason`` — every
google-genai chunk of a stream but the last, or an SDK object without one — is refused,
calls or not, and so is a missing one (chunks joined by hand or by a proxy). Streamed
pieces of a call (``partialArgs``, ``willContinue``) are read only from a stream
(``read_stream``). A candidate with no
content parts is a final answer only when ``finishReason`` says why (safety, recitation, max
tokens …); otherwise the envelope is refused. Exactly one candidate is read (with
``candidateCount > 1``, pass the response holding the one you continue with).

Calls without an ``id`` get stable synthetic ids (see ``gemini_ids``). This surface shares no
fields with Gemini Interactions.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import callgate.producer.adapters.gemini_ids as gemini_ids
import callgate.producer.adapters.names as names
from callgate.core.errors import ErrorCode
from callgate.core.types import ProposedCall
from callgate.producer.adapters.base import (
    arr,
    fail,
    get,
    obj,
    proposal,
    require_reason,
    show,
    unique,
)
from callgate.producer.adapters.definitions import ToolSpec
from callgate.producer.adapters.results import Result, body

SURFACE = "gemini-generate-content"
_decode = partial(names.tool_name, SURFACE)
# finishReason values (google-genai FinishReason) sorted by what they mean for the calls.
# The model tried to call a tool and failed.
_FAILED_CALL = ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS")
# Not an answer at all: generation continues in a later request (CONTINUATION), the
# response is broken (MALFORMED_RESPONSE), or the request was (MISSING_THOUGHT_SIGNATURE).
_UNFINISHED = ("CONTINUATION", "MALFORMED_RESPONSE", "MISSING_THOUGHT_SIGNATURE")
# The only reasons a candidate's functionCall parts are complete. Every other reason
# (MAX_TOKENS, SAFETY, RECITATION, OTHER …, and any added later) stopped generation early,
# so a functionCall part in it may be cut off; without calls it is still a final answer.
_FINISHED = ("STOP", "FINISH_REASON_UNSPECIFIED")


def _parts(
    root: dict[str, object], allow_missing_stop_reason: bool
) -> tuple[list[object] | None, str | None]:
    """The one candidate's parts (None for a final answer without content) and finishReason."""
    if root.get("error") is not None:
        fail(ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response is an API error", "error")
    if root.get("candidates") is None:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            "no candidates: the prompt was blocked or this is not a GenerateContent response",
            "candidates",
        )
    candidates = arr(
        root["candidates"], ErrorCode.INVALID_PROVIDER_ENVELOPE, "candidates", "candidates"
    )
    if len(candidates) != 1:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"the response has {len(candidates)} candidates; pass one candidate to continue",
            "candidates",
        )
    candidate = obj(
        candidates[0], ErrorCode.INVALID_PROVIDER_ENVELOPE, "a candidate", "candidates[0]"
    )
    require_reason(
        candidate,
        ("finishReason", "finish_reason"),
        "candidates[0].finishReason",
        allow_missing=allow_missing_stop_reason,
    )
    finish = _finish(candidate)
    content = candidate.get("content")
    parts = get(content, "parts") if isinstance(content, dict) else None
    if parts is None:
        if finish is not None and finish not in _FINISHED:
            return None, finish
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            "the candidate has no content parts and no finishReason explaining why",
            "candidates[0].content",
        )
    items = arr(parts, ErrorCode.MALFORMED_TOOL_CALLS, "parts", "candidates[0].content.parts")
    return items, finish


def _finish(candidate: dict[str, object]) -> str | None:
    """The candidate's finishReason, refusing the ones that leave no answer to read."""
    finish = get(candidate, "finishReason", "finish_reason")
    if finish is None:
        return None
    if not isinstance(finish, str):
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            "finishReason is not text",
            "candidates[0].finishReason",
        )
    if finish in _FAILED_CALL:
        fail(ErrorCode.MALFORMED_TOOL_CALLS, f"the model's function call failed ({show(finish)})")
    if finish in _UNFINISHED:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"the candidate is not a finished answer (finishReason {show(finish)})",
            "candidates[0].finishReason",
        )
    return finish


def read(
    response: object, known_tools: frozenset[str], *, allow_missing_stop_reason: bool = False
) -> list[ProposedCall]:
    """Every ``functionCall`` part of the candidate, in part order."""
    root = obj(response, ErrorCode.INVALID_PROVIDER_ENVELOPE, "the response", "$")
    parts, finish = _parts(root, allow_missing_stop_reason)
    if parts is None:
        return []
    proposals: list[ProposedCall] = []
    for index, raw in enumerate(parts):
        at = f"candidates[0].content.parts[{index}]"
        part = obj(raw, ErrorCode.MALFORMED_TOOL_CALLS, "a part", at)
        raw_call = get(part, "functionCall", "function_call")
        if raw_call is None:
            continue
        if finish is not None and finish not in _FINISHED:
            fail(
                ErrorCode.INVALID_PROVIDER_ENVELOPE,
                f"generation stopped early (finishReason {show(finish)}): the function call"
                " may be cut off, so it is not read",
                at,
            )
        at += ".functionCall"
        call = obj(raw_call, ErrorCode.MALFORMED_TOOL_CALLS, "functionCall", at)
        if get(call, "partialArgs", "partial_args") is not None:
            fail(
                ErrorCode.INVALID_TOOL_CALL_FIELD,
                "streamed partial arguments are read from the stream (read_stream), not from"
                " one chunk",
                f"{at}.partialArgs",
            )
        if get(call, "willContinue", "will_continue") is True:
            fail(
                ErrorCode.INVALID_PROVIDER_ENVELOPE,
                "the function call continues in a later chunk (willContinue): read the stream",
                f"{at}.willContinue",
            )
        call_id = call.get("id")
        if call_id is None or call_id == "":
            call_id = gemini_ids.pending_id(len(proposals))
        proposals.append(
            proposal(
                call_id,
                call.get("name"),
                call.get("args"),
                path=at,
                known_tools=known_tools,
                decode_name=_decode,
                missing_arguments_is_empty=True,  # a call with no parameters omits args
            )
        )
    return unique(gemini_ids.assign(proposals))


def write(proposals: list[ProposedCall], results: list[Result]) -> dict[str, Any]:
    """One ``user`` content with a ``functionResponse`` part per result.

    ``response`` is the result body as an object (Gemini's field is a JSON object, not text);
    a result for a synthetic id carries no ``id`` and follows the model's call order.
    """
    parts: list[dict[str, Any]] = []
    for result in gemini_ids.in_expected_order(proposals, results):
        response: dict[str, Any] = {}
        if not gemini_ids.is_synthetic(result.call_id):
            response["id"] = result.call_id
        response["name"] = names.wire_name(SURFACE, result.tool_name, check_length=False)
        response["response"] = body(result)
        parts.append({"functionResponse": response})
    return {"role": "user", "parts": parts}


def tools(specs: list[ToolSpec]) -> list[dict[str, Any]]:
    """One Tool holding every declaration; ``parametersJsonSchema`` takes full JSON Schema."""
    declarations = [
        {
            "name": names.wire_name(SURFACE, spec.name),
            "description": spec.description,
            "parametersJsonSchema": spec.parameters,
        }
        for spec in specs
    ]
    return [{"functionDeclarations": declarations}] if declarations else []
