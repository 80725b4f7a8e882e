"""JSON inside a string, and string literals inside code, decoded for the redactor. Pure.

A tool's text may hold a JSON document (a request body in a log line), JSON encoded twice
(``"{\\"pwd\\": \\"…\\"}"``) or source code whose string literal holds JSON with escaped
quotes (``json.loads("{\\"password\\": …}")``). The text rules cannot see a name/value pair
or a secret key name through that: here each such part is decoded, handed back to the
redactor (``tree`` for a document, ``text`` for a literal's contents), and, only when that
found something, written back in the form it came in. Text with nothing to decode is
returned as it was, byte for byte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

# A decoded document → (its redacted form, whether anything was redacted); same for text.
Tree = Callable[[Any], tuple[Any, bool]]
Text = Callable[[str], tuple[str, bool]]

_DECODER = json.JSONDecoder(strict=False)
# Where a document that can hold a name may start: an object with a key, or an array of
# strings, arrays or objects (``[1, 2]`` and ``{}`` have nothing to redact).
_OPENING = re.compile(r"\{(?=\s*\")|\[(?=\s*[\"\[{])")
# A quoted literal (not itself escaped) on one line; only those holding an escaped quote are
# decoded: the text rules already read the others as they are.
_LITERAL = re.compile(r"(?<!\\)\"((?:[^\"\\\n]|\\.)*)\"|(?<![\\\w])'((?:[^'\\\n]|\\.)*)'")
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|(.))", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "0": "\0"}
# Failed decodes may each read far (a cut-off document), or be many (``[\"[\"[\"…``): each
# is charged what it read, at least _FAILURE_COST characters, against _READ_BUDGET per
# character of text plus _READ_FLOOR; past it, the rest is left to the text rules.
_READ_BUDGET = 4
_READ_FLOOR = 8192
_FAILURE_COST = 256
# A document nested deeper than this is left to the text rules: the redactor walks a
# document recursively (and Python's decoder gives up near 1,000 levels).
_MAX_NESTING = 64


def redact_embedded(text: str, *, tree: Tree, inner: Text) -> tuple[str, bool]:
    """``text`` with its embedded documents and escaped literals redacted."""
    found = False
    if '\\"' in text or "\\'" in text:
        text, found = _escaped(text, inner)
    if "{" in text or "[" in text:
        text, in_documents = _documents(text, tree)
        found = found or in_documents
    return text, found


def _escaped(text: str, inner: Text) -> tuple[str, bool]:
    """The whole text as the body of a JSON string (``{\\"pwd\\": …}`` without its quotes),
    or else each quoted literal holding an escaped quote."""
    if '"' not in _ESCAPE.sub("", text):  # every quote escaped: one string's body
        try:
            body = _DECODER.decode(f'"{text}"')
        except ValueError:
            pass
        else:
            cleaned, found = inner(body)
            return (json.dumps(cleaned, ensure_ascii=False)[1:-1], True) if found else (text, False)
    found = False

    def literal(m: re.Match[str]) -> str:
        nonlocal found
        quote = '"' if m.group(1) is not None else "'"
        body = m.group(1) if m.group(1) is not None else m.group(2)
        if '\\"' not in body and "\\'" not in body:
            return m.group()
        cleaned, hit = inner(_unescape(body, quote))
        if not hit:
            return m.group()
        found = True
        return quote + _escape(cleaned, quote) + quote

    return _LITERAL.sub(literal, text), found


def _unescape(body: str, quote: str) -> str:
    if quote == '"':
        try:
            decoded: str = _DECODER.decode(f'"{body}"')
            return decoded
        except ValueError:
            pass  # a Python literal's escapes (\x41, \'), read below

    def one(m: re.Match[str]) -> str:
        code = m.group(1) or m.group(2)
        if code:
            return chr(int(code, 16))
        return _ESCAPES.get(m.group(3), m.group(3))

    return _ESCAPE.sub(one, body)


def _escape(text: str, quote: str) -> str:
    if quote == '"':
        return json.dumps(text, ensure_ascii=False)[1:-1]  # JSON's escapes are Python's too
    for raw, escaped in (("\\", "\\\\"), ("'", "\\'"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        text = text.replace(raw, escaped)
    return text


def _too_deep(value: Any) -> bool:
    level: list[Any] = [value]
    for _ in range(_MAX_NESTING):
        level = [
            v
            for item in level
            for v in (item.values() if isinstance(item, dict) else item)
            if isinstance(v, dict | list)
        ]
        if not level:
            return False
    return True


def _documents(text: str, tree: Tree) -> tuple[str, bool]:
    out: list[str] = []
    pos, found = 0, False
    budget = _READ_BUDGET * len(text) + _READ_FLOOR
    for m in _OPENING.finditer(text):
        start = m.start()
        if start < pos:
            continue  # inside a document already decoded
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError as exc:  # not JSON, or a number past int's 4,300 digits
            budget -= max(getattr(exc, "pos", start) - start, _FAILURE_COST)
            if budget < 0:
                break
            continue
        except RecursionError:
            break  # nested past the decoder's limit, its end unknown: the rest is text
        cleaned, hit = (value, False) if _too_deep(value) else tree(value)
        if hit:
            compact = '": ' not in text[start:end] and '", ' not in text[start:end]
            separators = (",", ":") if compact else (", ", ": ")
            out += [text[pos:start], json.dumps(cleaned, ensure_ascii=False, separators=separators)]
            pos, found = end, True
        else:
            out.append(text[pos:end])
            pos = end
    out.append(text[pos:])
    return "".join(out), found
