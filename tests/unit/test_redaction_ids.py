"""Secrets a client puts in an id (``call_id``, ``operation_id``) or a tool name never reach
the exits operators read: a JSON log line's fields, a span's name and attributes, the audit
trace ``callgate trace`` and the API show. Ordinary ids reach them unchanged, and every id is
bounded in length there."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from callgate.core import logs
from callgate.observe import tracing
from callgate.producer.intake import redacted_trace
from callgate.tools import redaction
from tests.redaction_planted import ID_KEEPS, ID_PLANTS, Plant

REF = "3f2b9c1e-8a7d-4e6f-9b0a-1c2d3e4f5a6b"
TURN = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


@pytest.fixture
def log_lines() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JSONFormatter())
    logger = logging.getLogger("callgate.test_redaction_ids")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    # What every callgate process does before it logs: the ids a line carries are redacted.
    redaction.install_log_redaction()
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)


def _logged(logger: logging.Logger, stream: io.StringIO, value: str) -> str:
    """Every way an id reaches a log line: bound for a block, and on one event."""
    with logs.bind(call_id=value, operation_id=value):
        logs.event(logger, "call_started", tool=value)
    logs.event(logger, "call_ended", call_id=value, operation_id=value, tool=value)
    return stream.getvalue()


def _spans(exported: InMemorySpanExporter, value: str) -> str:
    """The spans of one call whose ids are all ``value``: its proposal and its delivery."""
    intake = tracing.Intake(True)
    intake.recorded(TURN, [tracing.Proposal(value, value, REF, value, tracing.REFUSED, "x")])
    with tracing.delivering(
        tool_name=value,
        call_id=value,
        turn_id=TURN,
        operation_id=value,
        call_ref=REF,
        trace_context=None,
        queue_wait_seconds=None,
    ):
        pass
    spans = exported.get_finished_spans()
    assert len(spans) >= 2
    return json.dumps([[s.name, dict(s.attributes or {})] for s in spans], ensure_ascii=False)


def _traced(value: str) -> str:
    event: dict[str, Any] = {
        "at": "2024-05-01T10:20:30.000+00:00",
        "turn_id": TURN,
        "call_id": value,
        "tool_name": value,
        "operation_id": value,
        "event": "reserved",
        "generation": 1,
        "detail": {},
    }
    return json.dumps(redacted_trace([event]), ensure_ascii=False)


@pytest.mark.parametrize("plant", ID_PLANTS, ids=[p.id for p in ID_PLANTS])
def test_a_secret_in_an_id_never_reaches_a_log_line(
    plant: Plant, log_lines: tuple[logging.Logger, io.StringIO]
) -> None:
    out = _logged(*log_lines, plant.value)
    for line in out.splitlines():
        doc = json.loads(line)
        assert doc["call_id"] and doc["operation_id"] and doc["tool"]
    assert [m for m in plant.markers if m in out] == [], out


@pytest.mark.parametrize("plant", ID_PLANTS, ids=[p.id for p in ID_PLANTS])
def test_a_secret_in_an_id_never_reaches_a_span(
    plant: Plant, exported: InMemorySpanExporter
) -> None:
    out = _spans(exported, plant.value)
    assert [m for m in plant.markers if m in out] == [], out


@pytest.mark.parametrize("plant", ID_PLANTS, ids=[p.id for p in ID_PLANTS])
def test_a_secret_in_an_id_never_reaches_the_trace(plant: Plant) -> None:
    out = _traced(plant.value)
    assert [m for m in plant.markers if m in out] == [], out


@pytest.mark.parametrize("value", ID_KEEPS)
def test_ordinary_ids_reach_every_exit_unchanged(
    value: str, log_lines: tuple[logging.Logger, io.StringIO], exported: InMemorySpanExporter
) -> None:
    for line in _logged(*log_lines, value).splitlines():
        doc = json.loads(line)
        assert (doc["call_id"], doc["operation_id"], doc["tool"]) == (value, value, value)
    spans = exported.get_finished_spans()
    _spans(exported, value)
    for span in exported.get_finished_spans()[len(spans) :]:
        attributes = dict(span.attributes or {})
        assert attributes.get("gen_ai.tool.call.id", value) == value
        assert attributes.get("gen_ai.tool.name", value) == value
        assert attributes.get("callgate.operation_id", value) == value
    (row,) = json.loads(_traced(value))
    assert (row["call_id"], row["tool_name"], row["operation_id"]) == (value, value, value)


def test_an_id_is_bounded_at_every_exit(
    log_lines: tuple[logging.Logger, io.StringIO], exported: InMemorySpanExporter
) -> None:
    long = "order-" + "x" * 5000
    for out in (_logged(*log_lines, long), _spans(exported, long), _traced(long)):
        assert "x" * 201 not in out
        assert "order-" in out and "chars)" in out
