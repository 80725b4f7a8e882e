"""Outside data as plain JSON, and bounded in messages. Pure: no I/O, no SDK imports.

The provider adapters read model responses through these, and so does the worker's MCP
client read MCP replies: both receive an SDK's pydantic object, a raw body or plain data,
and both must name a bad value in an error without repeating it whole.
"""

from __future__ import annotations

import json
from typing import NoReturn

from callgate.core.errors import AdapterError, ErrorCode


def show(value: object, limit: int = 64) -> str:
    """A bounded repr for messages: names and ids only, never argument values."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        # Model-controlled values can defeat repr: an int past sys.get_int_max_str_digits()
        # raises ValueError, a list nested thousands deep RecursionError. A message about a
        # bad value must not become a crash of its own.
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_plain(value: object) -> object:
    """Turn an SDK response object into plain JSON data; pass plain data through.

    The official SDKs (openai, anthropic, google-genai) all hand out pydantic models. We call
    their ``model_dump`` by duck typing so this package never imports an SDK. ``by_alias``
    gives the wire spelling (google-genai's models alias snake_case fields to camelCase).
    Null fields are kept: an SDK helper's snapshot of a cut-off stream differs from a whole
    response only by a null stop/finish reason, which dropping nulls would hide (an SDK
    object's absent field dumps as null too). Serializer warnings are off: the SDKs' own
    unions warn on their own objects (a ``ParsedResponse`` holding a message item), and
    under ``-W error`` a warning would turn a valid response into a refusal.
    Text or bytes are parsed as JSON, for callers holding a raw HTTP body.
    """
    if isinstance(value, str | bytes | bytearray):
        try:
            return json.loads(value, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise AdapterError(
                "the response text is not JSON", code=ErrorCode.INVALID_PROVIDER_ENVELOPE
            ) from exc
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return dump(mode="json", by_alias=True, warnings=False)
        except Exception as exc:  # an SDK's own serialiser failing is its envelope's fault
            raise AdapterError(
                f"could not read the {type(value).__name__} object as JSON",
                code=ErrorCode.INVALID_PROVIDER_ENVELOPE,
            ) from exc
    return value


def _reject_constant(name: str) -> NoReturn:
    # json.loads accepts NaN and Infinity by default; they are not JSON and not arguments.
    raise ValueError(f"{name} is not valid JSON")
