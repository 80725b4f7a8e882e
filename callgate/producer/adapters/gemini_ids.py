"""Call ids for Gemini GenerateContent function calls that arrive without one.

GenerateContent's ``functionCall.id`` is optional, and real responses omit it. Callgate still
needs a unique id per call to record, run and correlate it, so an id-less call gets

    callgate-gemini-<digest>-<position>

where ``digest`` is the first 16 hex digits of a SHA-256 over the response's calls (name,
arguments and provider id of every call, in order) and ``position`` is the call's index among
them. Reading the same response twice gives the same ids; two calls of one response never
share one, even when they are identical.

Gemini matches responses to id-less calls by position, so a result for a synthetic id goes
back *without* an id and in the model's call order — what google-genai's own automatic
function calling sends. The prefix marks an id as ours; a provider id that happened to start
with it would be treated as synthetic.

Interactions steps always carry an id, which the ``function_result`` must echo, so an id-less
step there is refused rather than given one of these.
"""

from __future__ import annotations

import hashlib
import json

from callgate.core.errors import ErrorCode
from callgate.core.types import ProposedCall
from callgate.producer.adapters.base import fail
from callgate.producer.adapters.results import Result

PREFIX = "callgate-gemini-"
# Stand-in ids while a response is read; replaced once every call's content is known.
_PENDING = PREFIX + "pending-"


def pending_id(position: int) -> str:
    return f"{_PENDING}{position}"


def is_synthetic(call_id: str) -> bool:
    return call_id.startswith(PREFIX)


def assign(calls: list[ProposedCall]) -> list[ProposedCall]:
    """Replace pending ids with stable ones derived from the calls' content and position."""
    if not any(call.call_id.startswith(_PENDING) for call in calls):
        return calls
    content = [
        [
            call.tool_name,
            call.arguments,
            None if call.call_id.startswith(_PENDING) else call.call_id,
        ]
        for call in calls
    ]
    # sort_keys makes key order irrelevant. base.check_json bounds depth and integer size, so
    # this should always serialise; if it does not, the call is refused, never a crash.
    try:
        canonical = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, TypeError, RecursionError):
        fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "the call's arguments do not serialise as JSON")
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return [
        call.model_copy(update={"call_id": f"{PREFIX}{digest}-{position}"})
        if call.call_id.startswith(_PENDING)
        else call
        for position, call in enumerate(calls)
    ]


def in_expected_order(proposals: list[ProposedCall], results: list[Result]) -> list[Result]:
    """Results in the model's call order when some call had no provider id (Gemini then
    matches by position); otherwise in the caller's order, each keyed by its id."""
    if not any(is_synthetic(call.call_id) for call in proposals):
        return results
    position = {call.call_id: index for index, call in enumerate(proposals)}
    return sorted(results, key=lambda result: position[result.call_id])
