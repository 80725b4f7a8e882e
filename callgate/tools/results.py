"""Safe results: what a model may see of a tool's output. Pure: no I/O.

A result is untrusted data. It is projected onto the tool's result schema (unknown fields
dropped), secrets, tokens, passwords and stack traces are redacted
(``callgate.tools.redaction``, in keys, values and name/value pairs), sizes are capped,
and it is wrapped with its source and a trust label. Nothing in it is ever read back as an
instruction: callgate's registry, allowlists and principals come from code, configuration
and the turn's server-trusted context, never from a result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from callgate.core.errors import CallgateError
from callgate.core.types import TRUST_LABEL
from callgate.tools import redaction
from callgate.tools.registry import ResultLimits, Tool

REDACTED = redaction.REDACTED


def safe_result(tool: Tool, data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The envelope a model sees for a successful call, and notes for the trace."""
    notes: list[str] = []
    content: Any = dict(data) if isinstance(data, Mapping) else data
    if tool.result is not None:
        try:
            # extra="ignore" models drop fields the tool did not declare.
            content = tool.result.model_validate(content).model_dump(mode="json")
        except ValidationError:
            notes.append("result_withheld")
            content = None
    if content is not None:
        content = bounded_value(content, tool.limits, notes)
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


def bounded_value(value: Any, limits: ResultLimits, notes: list[str], depth: int = 0) -> Any:
    """Redact and cap any JSON value; make it storable (no NUL, no NaN). A value JSON cannot
    carry (bytes, a set) is left as it is: storing the result then fails, and the call ends
    with ``execution_failed``."""
    if depth > limits.max_depth:
        notes.append("depth_capped")
        return "[truncated]"
    if isinstance(value, Mapping):
        pair = redaction.secret_pair(value)
        out: dict[str, Any] = {}
        for key, item in list(value.items())[: limits.max_items]:
            name = storable(str(key), notes)
            shown = redaction.redact_key(name, out, notes)
            if redaction.is_secret_name(name) or (pair and name in redaction.pair_value_keys()):
                notes.append("secret_redacted")
                out[shown] = REDACTED
            else:
                out[shown] = bounded_value(item, limits, notes, depth + 1)
        if len(value) > limits.max_items:
            notes.append("fields_capped")
        return out
    if isinstance(value, list | tuple):
        if len(value) > limits.max_items:
            notes.append("items_capped")
        if redaction.secret_pair(value):
            notes.append("secret_redacted")
            return [bounded_value(value[0], limits, notes, depth + 1), REDACTED]
        return [bounded_value(v, limits, notes, depth + 1) for v in value[: limits.max_items]]
    if isinstance(value, str):
        return redact_text(value, limits.max_string, notes)
    if isinstance(value, float) and not math.isfinite(value):
        notes.append("non_finite_number_dropped")  # JSON has no NaN or Infinity
        return None
    return value


def redact_text(text: str, max_length: int, notes: list[str] | None = None) -> str:
    """Secrets and stack traces out, then the length capped."""
    notes = notes if notes is not None else []
    cleaned = redaction.redact_secrets(storable(text, notes), notes)
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


def failure_status(err: CallgateError) -> str:
    """The terminal status a refusal or failure ends a call in: the same call, unchanged, may
    succeed later only for the retryable codes."""
    return "failed_retryable" if err.retryable else "failed_terminal"


def failure_error(err: CallgateError) -> dict[str, Any]:
    """The error a model sees for ``err``, with the downstream's retry hint when it gave one."""
    error = safe_error(err.code.value, err.details)
    hint = getattr(err, "retry_after_ms", None)
    if err.retryable and isinstance(hint, int) and hint > 0:
        error["retry_after_ms"] = hint  # the downstream's hint, passed on to the model
    return error
