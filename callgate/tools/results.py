"""Safe results: what a model may see of a tool's output. Pure: no I/O.

A result is untrusted data. It is projected onto the tool's result schema (unknown fields
dropped), secrets, tokens, passwords and stack traces are redacted
(``callgate.tools.redaction``, in keys, values and name/value pairs), sizes are capped,
and it is wrapped with its source and a trust label. Nothing in it is ever read back as an
instruction: callgate's registry, allowlists and principals come from code, configuration
and the turn's server-trusted context, never from a result.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Mapping
from typing import Any

from PIL import GifImagePlugin, ImageFile, JpegImagePlugin, PngImagePlugin
from pydantic import ValidationError

from callgate.core.errors import CallgateError
from callgate.core.types import TRUST_LABEL
from callgate.tools import redaction
from callgate.tools.redaction_names import is_secret_name
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
        image = image_data(value, limits, notes)
        items = list(value.items())[: limits.max_items]
        split = redaction.joined_secrets([item for _, item in items])
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(items):
            name = storable(str(key), notes)
            if name == IMAGE_DATA and isinstance(value.get(IMAGE_TYPE), str):
                out[name] = image  # bytes of a picture, not text: the text rules do not apply
                continue
            shown = redaction.redact_key(name, out, notes)
            if i in split or is_secret_name(name) or (pair and name in redaction.pair_value_keys()):
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
        kept = value[: limits.max_items]
        split = redaction.joined_secrets(kept)
        if split:
            notes.append("secret_redacted")
        return [
            REDACTED if i in split else bounded_value(v, limits, notes, depth + 1)
            for i, v in enumerate(kept)
        ]
    if isinstance(value, str):
        return redact_text(value, limits.max_string, notes)
    if isinstance(value, int):
        return redaction.redact_number(value, notes)
    if isinstance(value, float) and not math.isfinite(value):
        notes.append("non_finite_number_dropped")  # JSON has no NaN or Infinity
        return None
    return value


# An image in a result: ``{"mime_type": "image/png", "data_base64": "…"}``. Its data is
# not text, so the text rules (which would take a long base64 run for a token) do not apply;
# instead it passes only when it decodes, fits the tool's ``max_image_bytes``, and is what
# it says it is (``image_type``). Anything else under that key is withheld (None).
IMAGE_TYPE = "mime_type"
IMAGE_DATA = "data_base64"
# A header claiming more than this on a side is a decompression bomb for whoever renders
# it, and larger than any model's image input.
MAX_IMAGE_SIDE = 16_384
_IMAGE_FORMATS: dict[str, tuple[tuple[bytes, ...], type[ImageFile.ImageFile]]] = {
    "image/png": ((b"\x89PNG\r\n\x1a\n",), PngImagePlugin.PngImageFile),
    "image/jpeg": ((b"\xff\xd8\xff",), JpegImagePlugin.JpegImageFile),
    "image/gif": ((b"GIF87a", b"GIF89a"), GifImagePlugin.GifImageFile),
}


def image_type(raw: bytes) -> str | None:
    """The MIME type of the PNG, JPEG or GIF image ``raw`` is; None for anything else.

    Pillow's decoder for the format its first bytes name reads the header (a PNG's chunks
    are checked against their CRCs up to IEND), and both sides must be within
    ``MAX_IMAGE_SIDE``: a signature followed by anything else (HTML, say) is not an image.
    The pixels are never decoded here, outside any sandbox. Pure: bytes in memory."""
    for mime, (magic, decoder) in _IMAGE_FORMATS.items():
        if raw.startswith(magic):
            return mime if _reads_as(decoder, raw) else None
    return None


def _reads_as(decoder: type[ImageFile.ImageFile], raw: bytes) -> bool:
    try:
        with decoder(io.BytesIO(raw)) as image:
            width, height = image.size
            if isinstance(image, PngImagePlugin.PngImageFile):
                image.verify()
    except Exception:  # whatever a decoder raises on untrusted bytes means "not an image"
        return False
    return 0 < width <= MAX_IMAGE_SIDE and 0 < height <= MAX_IMAGE_SIDE


def image_data(value: Mapping[str, Any], limits: ResultLimits, notes: list[str]) -> str | None:
    """The ``data_base64`` of an image mapping that may pass whole; None (noted) if not."""
    data, kind = value.get(IMAGE_DATA), value.get(IMAGE_TYPE)
    if not isinstance(kind, str) or IMAGE_DATA not in value:
        return None
    if not isinstance(data, str) or kind not in _IMAGE_FORMATS or limits.max_image_bytes <= 0:
        notes.append("image_withheld")
        return None
    if len(data) > (limits.max_image_bytes + 2) // 3 * 4 + 4:
        notes.append("image_withheld")
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        notes.append("image_withheld")
        return None
    if len(raw) > limits.max_image_bytes or image_type(raw) != kind:
        notes.append("image_withheld")
        return None
    return data


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


# What the result of a repeat-safe write that failed says (after its retries), so the
# application knows its next step.
RESEND_IS_SAFE = (
    "a resend under the same operation id is safe: its downstream replays the idempotency key"
)
