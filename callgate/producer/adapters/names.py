"""Tool names each surface accepts, and a reversible encoding for the names it does not.

Callgate tool names are free text (``billing.refund``, ``crm/lookup``), but OpenAI and
Anthropic accept only ``^[a-zA-Z0-9_-]{1,64}$`` and Gemini only names that start with a letter
or ``_`` followed by ``[a-zA-Z0-9_.:-]``, at most 128 long. The encoding:

- a name the surface accepts as it is, and that does not start with ``cg-``, is sent unchanged
  (so ordinary ``get_weather`` stays readable to the model and in provider dashboards);
- any other name is sent as ``cg-`` followed by the name percent-encoded, with ``-`` in place
  of ``%``: every character outside the surface's safe set (letters, digits, ``_``, and for
  Gemini also ``.`` and ``:``) becomes ``-hh`` per UTF-8 byte, lowercase hex. For OpenAI
  ``billing.refund`` becomes ``cg-billing-2erefund``; for Gemini it is sent unchanged.

Encoded names start with ``cg-`` and unchanged names never do, and inside an encoded name ``-``
only ever starts an escape, so decoding is unambiguous. Decoding also re-encodes and refuses
any spelling that is not the canonical one, which makes the mapping a bijection: a model cannot
reach a tool through a second spelling of its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from callgate.core.errors import ErrorCode
from callgate.producer.adapters.base import fail

PREFIX = "cg-"
_ESCAPE = re.compile(r"-([0-9a-f]{2})")


@dataclass(frozen=True)
class NameRule:
    native: re.Pattern[str]  # names the surface accepts
    safe: frozenset[str]  # characters an encoded name keeps literally
    max_length: int


_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_OPENAI = NameRule(re.compile(r"[a-zA-Z0-9_-]{1,64}"), _ALNUM, 64)
# Anthropic documents the same pattern as OpenAI; 64 is the conservative length.
_ANTHROPIC = NameRule(re.compile(r"[a-zA-Z0-9_-]{1,64}"), _ALNUM, 64)
# google-genai FunctionDeclaration.name; Interactions documents no rule of its own, so we
# assume it shares GenerateContent's.
_GEMINI = NameRule(re.compile(r"[a-zA-Z_][a-zA-Z0-9_.:-]{0,127}"), _ALNUM | {".", ":"}, 128)

RULES: dict[str, NameRule] = {
    "openai-chat": _OPENAI,
    "openai-responses": _OPENAI,
    "anthropic-messages": _ANTHROPIC,
    "gemini-generate-content": _GEMINI,
    "gemini-interactions": _GEMINI,
}


def _encode(rule: NameRule, name: str) -> str:
    if rule.native.fullmatch(name) and not name.startswith(PREFIX):
        return name
    body = "".join(
        char
        if char in rule.safe
        else "".join(f"-{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
        for char in name
    )
    return PREFIX + body


def wire_name(surface: str, name: str, *, check_length: bool = True) -> str:
    """The name ``surface`` will see for the callgate tool ``name``."""
    if not name:
        fail(ErrorCode.INVALID_CONFIGURATION, "a tool has an empty name")
    rule = RULES[surface]
    wire = _encode(rule, name)
    if check_length and len(wire) > rule.max_length:
        fail(
            ErrorCode.INVALID_CONFIGURATION,
            f"tool name {name!r} is {len(wire)} characters on {surface} once encoded;"
            f" the surface accepts at most {rule.max_length}",
        )
    return wire


def tool_name(surface: str, wire: str) -> str | None:
    """The callgate tool name behind a name the model used, or None if it is no canonical
    spelling of any name (the caller reports that as ``unknown_tool``)."""
    rule = RULES[surface]
    if not wire.startswith(PREFIX):
        return wire if _encode(rule, wire) == wire else None
    body = wire[len(PREFIX) :]
    raw = bytearray()
    position = 0
    while position < len(body):
        char = body[position]
        if char == "-":
            match = _ESCAPE.match(body, position)
            if match is None:
                return None
            raw.append(int(match.group(1), 16))
            position = match.end()
        else:
            raw.extend(char.encode("utf-8", "surrogatepass"))
            position += 1
    try:
        name = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return name if name and _encode(rule, name) == wire else None
