"""The values callgate records: strict JSON that PostgreSQL can hold. Pure: no I/O.

PostgreSQL's text and jsonb refuse a NUL (U+0000) anywhere, and a lone surrogate
(U+D800–U+DFFF) is not Unicode text, so it cannot be encoded as UTF-8; jsonb has no NaN or
Infinity either. Python's ``json`` accepts NaN, Infinity and duplicate keys (the last wins),
turns ``1e400`` into ``inf`` and raises ``RecursionError`` on deep nesting. A value that
slipped through would be refused by the database later, where it can break a call that was
already accepted, so everything recorded passes through here first.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from callgate.core.errors import JSONValueError

# Containers nested deeper than this are refused: real tool arguments nest a few levels, and
# Python's own parser and serialiser give up (RecursionError) near 1,000.
MAX_JSON_DEPTH = 64
# Integers must stay printable as JSON: CPython refuses to print more than 4,300 digits.
MAX_INT_BITS = 4096
# How much of a hostile key or id an error message repeats.
SHOWN_CHARS = 60
# Arguments a model sent that are not JSON are kept, hashed and stored as {RAW_ARGUMENTS: text}:
# only the identical string repeats such a call, and the gate refuses it with the text shown.
RAW_ARGUMENTS = "$raw"

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text`` (a NUL, a lone surrogate), or ``None``."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return "a NUL character (\\u0000), which PostgreSQL cannot store"
    return f"a lone surrogate (\\u{ord(found.group()):04x}), which is not Unicode text"


def printable(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` made safe for a one-line message: every unprintable code point (control,
    format, surrogate, line breaks) escaped, and cut after ``limit`` characters."""
    shown = "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in text[:limit])
    return shown + "..." if len(text) > limit else shown


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\\":
        return "\\\\"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def loads(text: str, *, check_values: bool = True) -> Any:
    """Parse ``text`` as strict JSON and (unless ``check_values`` is false) :func:`check`
    the result.

    Refused (``JSONValueError``): NaN and Infinity, numbers that overflow (``1e400``),
    integers past ``MAX_INT_BITS``, a key twice in one object, nesting Python cannot parse;
    with ``check_values`` also nesting past ``MAX_JSON_DEPTH`` and strings PostgreSQL
    cannot store. ``syntax`` is set on the error when the text is simply not JSON.
    """
    try:
        value = json.loads(
            text,
            parse_constant=_no_constant,
            parse_float=_finite,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_keys,
        )
    except JSONValueError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONValueError(
            f"not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno})", syntax=True
        ) from None
    except RecursionError:
        raise JSONValueError(f"nesting deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:  # int() past sys.get_int_max_str_digits()
        raise JSONValueError(f"an integer of more than {MAX_INT_BITS} bits") from None
    if check_values:
        check(value)
    return value


def check(value: Any) -> None:
    """Refuse anything in ``value`` that is not plain JSON PostgreSQL can store.

    Plain JSON: ``dict`` with ``str`` keys, ``list``, ``str``, finite ``float``, ``int`` of
    at most ``MAX_INT_BITS`` bits, ``bool``, ``None``; at most ``MAX_JSON_DEPTH`` nested
    containers; no key or string with a NUL or a lone surrogate.
    """
    _check(value, [], 0)


def _check(value: Any, path: list[str], depth: int) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        reason = unstorable(value)
        if reason is not None:
            _refuse(reason, path)
        return
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            _refuse(f"an integer of more than {MAX_INT_BITS} bits", path)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            _refuse(f"{value!r}, which is not a JSON number", path)
        return
    if isinstance(value, list | Mapping):
        if depth >= MAX_JSON_DEPTH:
            _refuse(f"nesting deeper than {MAX_JSON_DEPTH} levels", path)
        if isinstance(value, list):
            for index, item in enumerate(value):
                path.append(str(index))
                _check(item, path, depth + 1)
                path.pop()
            return
        for key, item in value.items():
            if not isinstance(key, str):
                _refuse(f"a key that is not a string ({type(key).__name__})", path)
            path.append(key)
            reason = unstorable(key)
            if reason is not None:
                _refuse(f"{reason}, in this key", path)
            _check(item, path, depth + 1)
            path.pop()
        return
    _refuse(f"a value that is not JSON ({type(value).__name__})", path)


def pointer(path: list[str]) -> str:
    """A printable JSON Pointer to ``path``, shortened for messages."""
    raw = "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)
    return printable(raw, limit=2 * SHOWN_CHARS) or "(the top)"


def _refuse(reason: str, path: list[str]) -> NoReturn:
    where = pointer(path)
    raise JSONValueError(f"{where}: {reason}", path=where)


def _no_constant(name: str) -> NoReturn:
    raise JSONValueError(f"{name}, which is not a JSON number")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JSONValueError(f"a number too large for JSON ({printable(literal, 20)})")
    return value


def _bounded_int(literal: str) -> int:
    # Checked on the text first: int() of a huge literal is slow, and past 4,300 digits fails.
    if len(literal) > MAX_INT_BITS // 3 + 2:
        raise JSONValueError(f"an integer of more than {MAX_INT_BITS} bits")
    value = int(literal)
    if value.bit_length() > MAX_INT_BITS:
        raise JSONValueError(f"an integer of more than {MAX_INT_BITS} bits")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            # Last-wins would silently pick one of two meanings.
            raise JSONValueError(
                f"the key '{printable(key)}' twice in one object; a key may appear once"
            )
        doc[key] = value
    return doc
