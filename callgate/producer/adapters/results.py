"""Outbound: assert complete correlation, then give each result one JSON body.

Pure: no I/O. This mirrors ``callgate.producer.fanin.correlate`` with one deliberate
difference: fan-in drops an *identical* second copy of a result (the relayer may publish
twice), while here any second result for a call is ``duplicate_result`` — by the time
results are serialised for a provider they have been fanned in already, so a repeat is the
caller's mistake. Checks run in this order: non-terminal, duplicate, extra, tool name, then missing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from callgate.core.errors import ErrorCode
from callgate.core.types import (
    RESULT_ADAPTER,
    TERMINAL_STATES,
    TRUST_LABEL,
    AppError,
    FailedRetryable,
    FailedTerminal,
    ProposedCall,
    Succeeded,
)
from callgate.producer.adapters.base import AdapterCorrelationError, AdapterError, show

Result = Succeeded | FailedRetryable | FailedTerminal


def _raise(code: ErrorCode, message: str) -> AdapterCorrelationError:
    return AdapterCorrelationError(message, code=code)


def as_proposals(proposals: Iterable[object]) -> list[ProposedCall]:
    """ProposedCall values, or mappings shaped like one; ids must be unique."""
    calls: list[ProposedCall] = []
    for raw in proposals:
        if isinstance(raw, ProposedCall):
            calls.append(raw)
            continue
        try:
            calls.append(ProposedCall.model_validate(_plain(raw)))
        except ValidationError:
            raise AdapterError(
                "a proposal is not a ProposedCall", code=ErrorCode.INVALID_INPUT
            ) from None
    seen: set[str] = set()
    for call in calls:
        if call.call_id in seen:
            raise AdapterError(
                f"two proposals share the call id {show(call.call_id)}",
                code=ErrorCode.DUPLICATE_CALL_ID,
            )
        seen.add(call.call_id)
    return calls


def _plain(raw: object) -> object:
    if isinstance(raw, BaseModel):
        return raw.model_dump()
    return raw


def _field(raw: object, key: str) -> object:
    if isinstance(raw, Mapping):
        return raw.get(key)
    return getattr(raw, key, None)


def correlate(proposals: list[ProposedCall], results: Iterable[object]) -> list[Result]:
    """Exactly one terminal result per proposal, with the proposal's tool name.

    Returns the results validated and in the caller's order; raises an
    ``AdapterCorrelationError`` whose code names the first fault found.
    """
    expected = {call.call_id: call.tool_name for call in proposals}
    checked: list[Result] = []
    seen: set[str] = set()
    for raw in results:
        status = _field(raw, "status")
        call_id = _field(raw, "call_id")
        if status not in TERMINAL_STATES:
            raise _raise(
                ErrorCode.NON_TERMINAL_RESULT,
                f"a result for call {show(call_id)} has non-terminal status {show(status)}",
            )
        if not isinstance(call_id, str):
            raise _raise(ErrorCode.NON_TERMINAL_RESULT, "a result has no string call_id")
        if call_id in seen:
            raise _raise(ErrorCode.DUPLICATE_RESULT, f"two results for call {show(call_id)}")
        if call_id not in expected:
            raise _raise(
                ErrorCode.EXTRA_RESULT, f"a result for call {show(call_id)}, which was not proposed"
            )
        tool = _field(raw, "tool_name")
        if tool != expected[call_id]:
            raise _raise(
                ErrorCode.TOOL_NAME_MISMATCH,
                f"the result for call {show(call_id)} names tool {show(tool)},"
                f" the proposal named {show(expected[call_id])}",
            )
        seen.add(call_id)
        checked.append(_validated(raw, call_id))
    missing = [call.call_id for call in proposals if call.call_id not in seen]
    if missing:
        raise _raise(ErrorCode.MISSING_RESULT, f"no result for call(s) {show(missing, 200)}")
    return checked


def _validated(raw: object, call_id: str) -> Result:
    if isinstance(raw, Succeeded | FailedRetryable | FailedTerminal):
        return raw
    try:
        return RESULT_ADAPTER.validate_python(_plain(raw))
    except ValidationError:
        # Same code fan-in uses: a result that is not a well-formed terminal result.
        raise _raise(
            ErrorCode.NON_TERMINAL_RESULT, f"the result for call {show(call_id)} is malformed"
        ) from None


def error_json(error: AppError) -> dict[str, Any]:
    """An AppError as the model sees it: the stable code, safe details, the retry hint."""
    body: dict[str, Any] = {"code": error.code}
    if error.details:
        body["details"] = [d.model_dump(mode="json", exclude_none=True) for d in error.details]
    if error.retry_after_ms is not None:
        body["retry_after_ms"] = error.retry_after_ms
    return body


def body(result: Result) -> dict[str, Any]:
    """The result body: ``{status, data}``, or ``{status, error, trust}`` for a failure.

    A success's data carries its trust label already; a failure's details are tool output
    too (a message, an expected value), so its body is labelled here, on every surface."""
    try:
        if isinstance(result, Succeeded):
            out = {"status": result.status, "data": result.model_dump(mode="json")["data"]}
        else:
            out = {"status": result.status, "error": error_json(result.error), "trust": TRUST_LABEL}
        # mode="json" turns NaN into null, but keeps an int too long to print (past
        # sys.get_int_max_str_digits(), in data or retry_after_ms), and pydantic refuses deep
        # nesting with a plain ValueError: check here, so Gemini's object-valued envelope is
        # JSON too.
        json.dumps(out, allow_nan=False)
    except (PydanticSerializationError, ValueError, RecursionError):
        raise _not_json(result) from None
    return out


def _not_json(result: Result) -> AdapterError:
    return AdapterError(
        f"the result of call {show(result.call_id)} is not JSON", code=ErrorCode.INVALID_INPUT
    )


def body_text(result: Result) -> str:
    """The body as compact JSON text, for surfaces whose result field is a string."""
    try:
        return json.dumps(body(result), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (ValueError, RecursionError):  # body() checked it already; this is a backstop
        raise _not_json(result) from None


def is_error(result: Result) -> bool:
    return not isinstance(result, Succeeded)
