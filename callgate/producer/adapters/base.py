"""What every surface adapter shares: the error type, JSON narrowing, and building proposals.

Pure: no I/O. Provider payloads are untrusted input, so every reader narrows ``object`` to
the shape it needs through these helpers, and every failure is an ``AdapterError`` with a
stable inbound code. Nothing else may escape a reader (a fuzz test holds us to that).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn

from pydantic import ValidationError

from callgate.core import values

# The error types and the plain-JSON helpers live in core (the worker's MCP client uses them
# too, and must not import the producer); re-exported here, where every adapter finds them.
from callgate.core.errors import AdapterCorrelationError as AdapterCorrelationError
from callgate.core.errors import AdapterError as AdapterError
from callgate.core.errors import ErrorCode, JSONValueError
from callgate.core.plain import show as show
from callgate.core.plain import to_plain as to_plain
from callgate.core.types import ProposedCall

# Bounds on what we will walk: the same as submit's (callgate/core/values.py).
MAX_JSON_DEPTH = values.MAX_JSON_DEPTH
# ProposedCall's own limits (core/types.py); checked here so they surface as adapter errors.
MAX_ID_LENGTH = 200
MAX_NAME_LENGTH = 200
MAX_INT_BITS = values.MAX_INT_BITS
# A lone UTF-16 surrogate: what "\ud83d" decodes to when its other half never came. Python
# holds it in a str, but it is not Unicode and cannot be encoded, hashed or stored.
_SURROGATE = re.compile("[\ud800-\udfff]")


def fail(code: ErrorCode, message: str, path: str | None = None) -> NoReturn:
    """Raise an AdapterError; ``path`` points at the offending field, never at its value."""
    details = [{"code": str(code), "path": path}] if path else None
    raise AdapterError(message, code=code, details=details)


def obj(value: object, code: ErrorCode, what: str, path: str) -> dict[str, object]:
    """``value`` as a JSON object with string keys, or an AdapterError with ``code``."""
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    fail(code, f"{what} is not a JSON object", path)


def arr(value: object, code: ErrorCode, what: str, path: str) -> list[object]:
    """``value`` as a JSON array (a list or tuple), or an AdapterError with ``code``."""
    if isinstance(value, list | tuple):
        return list(value)
    fail(code, f"{what} is not a JSON array", path)


def text(value: object, what: str, path: str, max_length: int) -> str:
    """A non-empty string field of a tool call."""
    if not isinstance(value, str) or not value:
        fail(
            ErrorCode.INVALID_TOOL_CALL_FIELD, f"{what} is missing or not a non-empty string", path
        )
    if len(value) > max_length:
        fail(ErrorCode.INVALID_TOOL_CALL_FIELD, f"{what} is longer than {max_length}", path)
    return value


def get(root: Mapping[str, object], *keys: str) -> object:
    """The first of ``keys`` present and not null (Gemini speaks camelCase and snake_case)."""
    for key in keys:
        value = root.get(key)
        if value is not None:
            return value
    return None


def require_reason(
    holder: Mapping[str, object],
    keys: tuple[str, ...],
    path: str,
    *,
    allow_missing: bool = False,
) -> None:
    """A whole response always says why it stopped: refuse one whose stop/finish reason (or
    status) is null, or left out unless the caller opted in.

    Null is what an SDK stream helper returns for a stream cut off mid-way
    (``get_final_message()``, ``get_final_completion()``, a stream chunk), with the last call's
    arguments truncated or later calls missing, and what an SDK object without a reason dumps
    to. Missing is what a stream joined by the application's own loop or by a proxy looks like
    when the connection dropped before the last chunk: the same calls, no reason. Both are
    refused, calls or not. ``allow_missing`` is the caller saying "I built this myself and it
    is finished" (a hand-built compact form); it never overrides a null.
    """
    present = [key for key in keys if key in holder]
    if present and all(holder[key] is None for key in present):
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"{present[0]} is null: the response never finished (a cut-off stream's snapshot"
            " is not a response); read the stream's events or a finished response",
            path,
        )
    if not present and not allow_missing:
        fail(
            ErrorCode.INVALID_PROVIDER_ENVELOPE,
            f"{keys[0]} is missing: nothing says the response finished (a cut-off stream"
            " joined by hand or by a proxy looks like this); pass the whole response, state"
            f" its {keys[0]}, or pass allow_missing_stop_reason=True for a response you built"
            " yourself",
            path,
        )


def check_json(value: object, path: str, depth: int = 0) -> None:
    """Arguments must be plain JSON: string keys, finite numbers, bounded depth, real Unicode.

    A plain dict handed to us by an application can hold anything (tuples, NaN, sets); the
    gate, the intent hash and the database all assume JSON, so refuse it here. A lone
    surrogate (half of a character, e.g. from a stream's ``"\\ud83d"`` whose other half never
    came) is ``invalid_arguments_json``: the text decoded, but not to Unicode.
    """
    if depth > MAX_JSON_DEPTH:
        fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "arguments nest too deeply", path)
    if isinstance(value, str):
        _check_text(value, path)
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            # json.dumps refuses ints past sys.get_int_max_str_digits() (4300 by default), so
            # the intent hash and the database would fail on it later, outside the adapter.
            fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "arguments hold an integer too large", path)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "arguments hold a non-finite number", path)
        return
    if isinstance(value, list):
        for item in value:
            check_json(item, path, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "arguments hold a non-string key", path)
            _check_text(key, path)
            check_json(item, path, depth + 1)
        return
    fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "arguments hold a value that is not JSON", path)


def _check_text(value: str, path: str) -> None:
    if _SURROGATE.search(value):
        fail(
            ErrorCode.INVALID_ARGUMENTS_JSON,
            "arguments hold a lone UTF-16 surrogate (half of a character), not Unicode text",
            path,
        )


def arguments(raw: object, path: str, *, missing_is_empty: bool = False) -> dict[str, Any]:
    """Parse a call's arguments into a JSON object.

    Text arguments (OpenAI always, Anthropic while streaming) must decode to a JSON *object*:
    anything else is ``invalid_arguments_json`` — the model's next move is the same, emit a
    valid arguments object. Structured arguments (Anthropic ``input``, Gemini ``args``) of the
    wrong type are an envelope fault: ``invalid_tool_call_field``.
    """
    if raw is None and missing_is_empty:
        return {}
    if isinstance(raw, str):
        try:
            # The parse submit and the gate use: a key twice, 1e400 or NaN is refused here.
            parsed = values.loads(raw, check_values=False)
        except JSONValueError as exc:
            fail(
                ErrorCode.INVALID_ARGUMENTS_JSON,
                f"arguments are not valid JSON ({exc.message})",
                path,
            )
        if not isinstance(parsed, dict):
            fail(
                ErrorCode.INVALID_ARGUMENTS_JSON,
                f"arguments decode to a JSON {type(parsed).__name__}, not an object",
                path,
            )
        raw = parsed
    if not isinstance(raw, Mapping):
        fail(ErrorCode.INVALID_TOOL_CALL_FIELD, "arguments are not a JSON object", path)
    result = dict(raw)
    check_json(result, path)
    return result


def proposal(
    call_id: object,
    wire_name: object,
    raw_arguments: object,
    *,
    path: str,
    known_tools: Collection[str],
    decode_name: Callable[[str], str | None],
    missing_arguments_is_empty: bool = False,
) -> ProposedCall:
    """One ProposedCall, checked in this order: name, arguments, id.

    A name that is no canonical spelling of any tool name on this surface (it decodes to
    nothing) refuses the whole response with ``unknown_tool``: only a name's one canonical
    spelling may reach the gate. A well-formed name that is not in ``known_tools`` (a model
    inventing a tool) is proposed as it is, and the gate ends that call alone with
    ``unknown_tool``: the response's other calls still run."""
    name = text(wire_name, "tool name", f"{path}.name", max_length=10_000)
    tool_name = decode_name(name)
    if tool_name is None:
        fail(ErrorCode.UNKNOWN_TOOL, f"the model called an unknown tool {show(name)}", path)
    if tool_name not in known_tools and (
        len(tool_name) > MAX_ID_LENGTH or values.unstorable(tool_name) is not None
    ):
        fail(ErrorCode.UNKNOWN_TOOL, f"the model called an unknown tool {show(name)}", path)
    args = arguments(
        raw_arguments, f"{path}.arguments", missing_is_empty=missing_arguments_is_empty
    )
    checked_id = text(call_id, "call id", f"{path}.id", MAX_ID_LENGTH)
    try:
        return ProposedCall(call_id=checked_id, tool_name=tool_name, arguments=args)
    except ValidationError as exc:  # the limits above should make this unreachable
        raise AdapterError(
            "the tool call does not fit a proposal", code=ErrorCode.INVALID_TOOL_CALL_FIELD
        ) from exc


def unique(calls: list[ProposedCall]) -> list[ProposedCall]:
    """Refuse a response that proposes two calls under one id: results could not be told apart."""
    seen: set[str] = set()
    for call in calls:
        if call.call_id in seen:
            fail(ErrorCode.DUPLICATE_CALL_ID, f"two tool calls share the id {show(call.call_id)}")
        seen.add(call.call_id)
    return calls
