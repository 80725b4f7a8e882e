"""Structured logs: one JSON object per line when stderr is not a terminal, a readable line
when it is; every record carries the ids of what it is about.

The standard library's ``logging`` does it: RQ, SQLAlchemy and every handler callgate runs
already log through it, so one formatter on the root handler covers them all, and the
redaction that rewrites each record as it is created (``callgate/tools/redaction.py``) keeps
working unchanged.

Ids come from ``extra={"call_id": ...}`` on one record, or from ``bind(...)`` for every
record a block of code writes (a context variable: each thread and each asyncio task has its
own). Only the fields in ``ID_FIELDS`` and ``EVENT_FIELDS`` are ever written, so arguments,
results or secrets passed as ``extra`` never reach a log line. An id a client chose (a call
id, an operation id, a tool name) is shown redacted and cut to ``MAX_ID_SHOWN`` characters,
as values are: a client may have typed a secret into it. A record written inside an
OpenTelemetry span also carries its ``trace_id`` and ``span_id`` (hex, as trace backends
show them), so a log line opens its trace.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, Final, Literal, TextIO
from urllib.parse import urlsplit

from opentelemetry import trace

# ``principal_id``: who decided an approval (a user id, the same the trace records).
ID_FIELDS: Final = (
    "turn_id",
    "call_id",
    "call_ref",
    "operation_id",
    "approval_id",
    "principal_id",
)
# Bounded facts about an event; never a value a model or a tool produced.
EVENT_FIELDS: Final = (
    "event",
    "tool",
    "kind",
    "state",
    "status",
    "code",
    "layer",
    "generation",
    "dispatches",
    "count",
    "duration_ms",
    "worker",
)
FIELDS: Final = ID_FIELDS + EVENT_FIELDS
# The fields whose values a client chose (a call id may hold whatever the client typed, a
# secret included): shown only through ``_show_id``.
CHOSEN_FIELDS: Final = (*ID_FIELDS, "tool")
# Ids are cut past this length until the redactor is installed (``show_ids_with``).
MAX_ID_SHOWN: Final = 200

LogFormat = Literal["auto", "json", "text"]

# The parent of the loggers of the processes' start and stop lines (``callgate.process.worker``
# and its siblings).
PROCESS_LOGGER: Final = "callgate.process"

_NONE: Final[Mapping[str, Any]] = MappingProxyType({})
_bound: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "callgate_log_ids", default=_NONE
)


@contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (ids, bounded event facts) to every record logged inside the block."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"not a log field: {sorted(unknown)}")
    token = _bound.set({**_bound.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _bound.reset(token)


def event(logger: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one state change: message ``name``, ``event=name`` and ``fields`` (ids and bounded
    facts from ``FIELDS``; ``None`` values are left out). Costs nothing when the level is
    off."""
    if logger.isEnabledFor(level):
        extra = {k: v for k, v in fields.items() if v is not None}
        logger.log(level, name.replace("_", " "), extra={"event": name, **extra})


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The allowed fields of ``record``: bound ones, overridden by the record's ``extra``;
    the current span's ``trace_id`` and ``span_id`` when one is active."""
    out = {k: v for k, v in _bound.get().items() if k in FIELDS}
    for key in FIELDS:
        value = record.__dict__.get(key)
        if value is not None:
            out[key] = value
    fields = {k: v if isinstance(v, int | float | bool) else str(v) for k, v in out.items()}
    for key in CHOSEN_FIELDS:
        value = fields.get(key)
        if isinstance(value, str):
            fields[key] = _show_id(value)
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        fields["trace_id"] = trace.format_trace_id(span.trace_id)
        fields["span_id"] = trace.format_span_id(span.span_id)
    return fields


def _bounded(value: str) -> str:
    if len(value) <= MAX_ID_SHOWN:
        return value
    return f"{value[:MAX_ID_SHOWN]}…(cut, {len(value)} chars)"


_show_id: Callable[[str], str] = _bounded


def show_ids_with(redact: Callable[[str], str]) -> None:
    """Show every id a line carries through ``redact``: the redactor's ``redact_id``, which
    installs itself here with the log redaction (this layer sits below it)."""
    global _show_id
    _show_id = redact


def _timestamp(record: logging.LogRecord) -> str:
    at = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JSONFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "process", <ids>, "exception"?}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        doc.update(fields_of(record))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = record.stack_info
        return json.dumps(doc, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: message [key=value ...]`` for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        fields = fields_of(record)
        if fields:
            line += " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + record.stack_info
        return line


def configure(level: str, fmt: LogFormat = "auto", stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one on ``stream`` (stderr) in ``fmt``:
    ``auto`` is JSON unless the stream is a terminal. Call once, at process start."""
    stream = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not _is_tty(stream))
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter() if use_json else TextFormatter())
    # The level is the process's, whatever a library sets on its own logger (bm25s sets
    # DEBUG on import): only the process's start and stop lines pass below it.
    threshold = logging.getLevelName(level.upper())
    handler.addFilter(lambda r: r.levelno >= threshold or r.name.startswith(PROCESS_LOGGER))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # A process's start and stop lines are INFO, yet seen at the default WARNING: what a
    # process serves is the first thing a person checks. ERROR and above hides them too.
    lines = logging.getLogger(PROCESS_LOGGER)
    lines.setLevel(logging.INFO if logging.INFO < root.level <= logging.WARNING else logging.NOTSET)


def address(url: str) -> str:
    """``host:port/path`` of a service URL, for a log line: never its user or password."""
    try:
        parts = urlsplit(url)
        if "," in parts.netloc:  # several hosts (redis+sentinel://): shown as they are
            return f"{parts.netloc.rpartition('@')[2]}{parts.path}"
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "?"
    return f"{host}{port}{parts.path}"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
