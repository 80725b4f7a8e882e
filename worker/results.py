"""Safe results: what a model may see of a tool's output. Pure: no I/O.

A result is untrusted data. It is projected onto the tool's result schema (unknown fields
dropped), secrets, tokens, passwords and stack traces are redacted, sizes are capped, and it
is wrapped with its source and a trust label. Nothing in it is ever read back as an
instruction: callgate's registry, allowlists and principals come from code, configuration
and the turn's server-trusted context, never from a result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from worker.registry import ResultLimits, Tool

TRUST_LABEL = "untrusted_tool_output"
REDACTED = "[redacted]"

# Keys whose values are never shown, whatever they hold.
_SECRET_KEY = re.compile(
    r"pass(word|wd)?|secret|token|api[_-]?key|authori[sz]ation|cookie|private[_-]?key|"
    r"credential|session[_-]?id|otp",
    re.IGNORECASE,
)
# Secrets written inline in text. "(?<![A-Za-z0-9])" rather than "\b": "\b" does not
# match after "_", and "access_token=" or "client_secret:" must be caught.
_NAME = (
    r"(?<![A-Za-z0-9])([A-Za-z0-9_.-]*"
    r"(?:password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key))"
)
_INLINE_SECRETS = (
    # An Authorization header's value is a credential whatever its scheme or length: whole.
    (
        re.compile(
            r"(?<![A-Za-z0-9])((?:proxy-)?authori[sz]ation[\"']?\s*[=:]\s*)"
            r"(\"[^\"]*\"|'[^']*'|[^;,\n]+)",
            re.IGNORECASE,
        ),
        rf"\1{REDACTED}",
    ),
    (
        re.compile(_NAME + r"([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s;,&]+)", re.IGNORECASE),
        rf"\1\2{REDACTED}",
    ),
    (
        re.compile(r"(?<![A-Za-z0-9])(stack(?:trace)?)(\s*[=:]\s*)[^;\n]+", re.IGNORECASE),
        rf"\1\2{REDACTED}",
    ),
    (
        re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
        rf"\1 {REDACTED}",
    ),
    # Credentials in a URL: scheme://user:password@host
    (re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+@"), f"{REDACTED}@"),
    (re.compile(r"\b(sk|pk|rk|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{12,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
        REDACTED,
    ),
)
# A Python traceback (header, indented frames, the exception line), or stray frame lines
# from any runtime ("File "x.py", line 3", "at pkg.Cls.method(Cls.java:42)").
_STACK_TRACE = re.compile(
    r"Traceback \(most recent call last\):\n(?:[ \t]+.*\n?)*(?:\S.*)?"
    r"|(?:^[ \t]*(?:File \"[^\"]+\", line \d+|at [\w.$<>]+\([^)]*\)).*\n?)+",
    re.M,
)


def safe_result(tool: Tool, data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The envelope a model sees for a successful call, and notes for the trace."""
    notes: list[str] = []
    content: Any = dict(data)
    if tool.result is not None:
        try:
            # extra="ignore" models drop fields the tool did not declare.
            content = tool.result.model_validate(content).model_dump(mode="json")
        except ValidationError:
            notes.append("result_withheld")
            content = None
    if content is not None:
        content = sanitise(content, tool.limits, notes)
    return {
        "source": {"tool": tool.name, "version": tool.version},
        "trust": TRUST_LABEL,
        "content": content,
    }, sorted(set(notes))


# Characters PostgreSQL cannot store in text or jsonb (NUL) and lone surrogates (not UTF-8):
# a result holding one could never be committed.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def storable(text: str, notes: list[str] | None = None) -> str:
    """``text`` with every character PostgreSQL cannot store replaced by U+FFFD."""
    cleaned, n = _UNSTORABLE.subn("\ufffd", text)
    if n and notes is not None:
        notes.append("unstorable_characters_replaced")
    return cleaned


def sanitise(value: Any, limits: ResultLimits, notes: list[str], depth: int = 0) -> Any:
    """Redact and cap any JSON value; make it storable (no NUL, no NaN)."""
    if depth > limits.max_depth:
        notes.append("depth_capped")
        return "[truncated]"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in list(value.items())[: limits.max_items]:
            name = storable(str(key), notes)
            if _SECRET_KEY.search(name):
                notes.append("secret_redacted")
                out[name] = REDACTED
            else:
                out[name] = sanitise(item, limits, notes, depth + 1)
        if len(value) > limits.max_items:
            notes.append("fields_capped")
        return out
    if isinstance(value, list | tuple):
        if len(value) > limits.max_items:
            notes.append("items_capped")
        return [sanitise(v, limits, notes, depth + 1) for v in value[: limits.max_items]]
    if isinstance(value, str):
        return redact_text(value, limits.max_string, notes)
    if isinstance(value, float) and not math.isfinite(value):
        notes.append("non_finite_number_dropped")  # JSON has no NaN or Infinity
        return None
    return value


def redact_text(text: str, max_length: int, notes: list[str] | None = None) -> str:
    """Secrets and stack traces out, then the length capped."""
    notes = notes if notes is not None else []
    cleaned = storable(text, notes)
    for pattern, replacement in _INLINE_SECRETS:
        cleaned, n = pattern.subn(replacement, cleaned)
        if n:
            notes.append("secret_redacted")
    cleaned, n = _STACK_TRACE.subn(
        lambda m: "[stack trace redacted]" + ("\n" if m.group().endswith("\n") else ""), cleaned
    )
    if n:
        notes.append("stack_trace_redacted")
    if len(cleaned) > max_length:
        notes.append("string_capped")
        cleaned = cleaned[:max_length] + "…[truncated]"
    return cleaned


_DETAIL_FIELDS = ("code", "path", "expected", "message")


def safe_error(
    code: str, details: list[dict[str, Any]], message: str | None = None
) -> dict[str, Any]:
    """An error a model may see: a stable code and only the safe, fixable detail fields."""
    clean = []
    for detail in details[:20]:
        kept = {
            k: redact_text(str(detail[k]), 240)
            for k in _DETAIL_FIELDS
            if k in detail and detail[k] is not None
        }
        kept.setdefault("code", code)
        clean.append(kept)
    error: dict[str, Any] = {"code": code, "details": clean}
    if message:
        error["message"] = redact_text(message, 240)
    return error
