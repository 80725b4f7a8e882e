"""Spans without services: the no-op path, the span tree of one delivery, the OTEL_*
switch, the logs' trace ids, and the SDK kept out of the core paths."""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import callgate
from callgate.core import logs
from callgate.core.errors import ErrorCode, InputError, ServiceUnavailable
from callgate.observe import tracing


def _deliver(trace_context: dict[str, str] | None, *, fail: str | None = None) -> None:
    with tracing.delivering(
        tool_name="get_weather",
        call_id="call-1",
        turn_id=uuid.UUID(int=1),
        operation_id="op-1",
        call_ref=uuid.UUID(int=2),
        trace_context=trace_context,
        queue_wait_seconds=0.05,
    ) as spans:
        spans.stage(tracing.RESERVATION)
        spans.reserved(2, True)
        spans.stage(tracing.HANDLER)
        spans.stage(tracing.COMPLETION)
        status = "succeeded" if fail is None else "failed_terminal"
        spans.finish(status, status, fail, {"schema": "pass"})


def test_without_a_provider_nothing_is_started_or_stored():
    assert not tracing.active()
    with tracing.delivering(
        tool_name="t",
        call_id="c",
        turn_id="x",
        operation_id="o",
        call_ref="r",
        trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
        queue_wait_seconds=1.0,
    ) as spans:
        assert spans is tracing.NOT_TRACED and not spans.on
        assert trace.get_current_span() is trace.INVALID_SPAN  # nothing was attached
    with tracing.submitting(3) as span:
        assert tracing.carrier_of(span) is None
    with tracing.proposing(span) as intake:
        assert not intake.on
    with tracing.streaming("t") as span:
        assert span is trace.INVALID_SPAN


def test_a_delivery_continues_the_submitters_trace_with_one_span_per_stage(exported):
    app_run = trace.get_tracer("app").start_as_current_span("agent run")
    with app_run as app, tracing.submitting(1) as submit:
        carrier = tracing.carrier_of(submit)
    assert carrier is not None and set(carrier) >= {"traceparent"}
    _deliver(carrier)

    spans = {s.name: s for s in exported.get_finished_spans()}
    tool = spans["execute_tool get_weather"]
    assert spans["callgate.submit"].parent.span_id == app.get_span_context().span_id
    assert tool.parent.span_id == spans["callgate.submit"].context.span_id
    assert tool.context.trace_id == app.get_span_context().trace_id
    assert dict(tool.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "call-1",
        "gen_ai.tool.type": "function",
        "callgate.turn_id": str(uuid.UUID(int=1)),
        "callgate.operation_id": "op-1",
        "callgate.call_ref": str(uuid.UUID(int=2)),
        "callgate.generation": 2,
        "callgate.attempt": 2,
        "callgate.takeover": True,
        "callgate.outcome": "succeeded",
        "callgate.status": "succeeded",
        "callgate.verdict.schema": "pass",
    }
    stages = [s for s in exported.get_finished_spans() if s.parent == tool.context]
    assert [s.name for s in sorted(stages, key=lambda s: s.start_time)] == [
        tracing.QUEUE_WAIT,
        tracing.GATE,
        tracing.RESERVATION,
        tracing.HANDLER,
        tracing.COMPLETION,
    ]
    # The queue wait starts when the call was dispatched, and so does the tool's span.
    wait = spans[tracing.QUEUE_WAIT]
    assert wait.start_time == tool.start_time
    assert 0.04e9 < wait.end_time - wait.start_time < 0.06e9
    assert trace.get_current_span() is trace.INVALID_SPAN  # every stage was detached


def test_a_failure_sets_error_type_and_an_escaping_exception_only_its_class(exported):
    _deliver(None, fail="invalid_arguments")
    (failed,) = [s for s in exported.get_finished_spans() if s.name.startswith("execute_tool")]
    assert failed.attributes["error.type"] == "invalid_arguments"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.parent is None  # no stored context: a trace of its own

    exported.clear()
    with (
        pytest.raises(RuntimeError),
        tracing.delivering(
            tool_name="t",
            call_id="c",
            turn_id="x",
            operation_id="o",
            call_ref="r",
            trace_context=None,
            queue_wait_seconds=None,
        ),
    ):
        raise RuntimeError("secret-argument-value")
    (span,) = [s for s in exported.get_finished_spans() if s.name == "execute_tool t"]
    assert span.attributes["error.type"] == "RuntimeError"
    assert span.events == ()  # the exception's text is never recorded
    assert "secret-argument-value" not in repr(span.to_json())


def test_a_takeover_links_to_the_attempts_it_took_over(exported):
    tracer = trace.get_tracer("test")
    first = tracing.Delivery(tracer.start_span("first attempt"))
    detail = first.stamped({"tool": "get_weather"})
    assert detail["tool"] == "get_weather" and "traceparent" in detail["span_context"]
    assert tracing.NOT_TRACED.stamped({"tool": "x"}) == {"tool": "x"}  # untraced: unchanged

    second = tracing.Delivery(tracer.start_span("takeover"))
    second.link([detail["span_context"], {"traceparent": "garbage"}])
    second.span.end()
    (taken,) = [s for s in exported.get_finished_spans() if s.name == "takeover"]
    assert [link.context.span_id for link in taken.links] == [first.span.get_span_context().span_id]


def test_a_failed_submit_or_collect_records_its_code_never_its_message(exported):
    with pytest.raises(InputError), tracing.submitting(1):
        raise InputError("city 'Seoul' is not a city")
    with pytest.raises(TimeoutError), tracing.collecting("t-1"):
        raise TimeoutError("Seoul")
    submit, collect = exported.get_finished_spans()
    assert submit.attributes["error.type"] == "invalid_input"
    assert collect.attributes["error.type"] == "TimeoutError"
    for span in (submit, collect):
        assert span.status.status_code is StatusCode.ERROR
        assert "Seoul" not in repr(span.to_json())


def test_a_log_record_inside_a_span_carries_its_ids(exported):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JSONFormatter())
    logger = logging.getLogger("callgate.test_tracing")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("outside")
        with trace.get_tracer("app").start_as_current_span("inside") as span:
            logger.warning("inside")
    finally:
        logger.removeHandler(handler)
    outside, inside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert "trace_id" not in outside and "span_id" not in outside
    assert inside["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert inside["span_id"] == f"{span.get_span_context().span_id:016x}"


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
    ],
)
def test_the_otel_variables_decide_whether_a_process_exports(env, wanted):
    assert tracing.wanted(env) is wanted


def _python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


SETUP = """
import sys
from opentelemetry import trace
from callgate.ops import telemetry
{before}
print(telemetry.setup("worker"), trace.get_tracer_provider().resource.attributes["service.name"])
"""


def test_a_process_sets_its_provider_from_the_environment_unless_one_is_set():
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert _python(SETUP.format(before=""), **endpoint) == "True callgate-worker"
    named = _python(SETUP.format(before=""), OTEL_SERVICE_NAME="billing-tools", **endpoint)
    assert named == "True billing-tools"
    own = (
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.resources import Resource\n"
        "trace.set_tracer_provider(TracerProvider(resource=Resource({'service.name': 'app'})))"
    )
    assert _python(SETUP.format(before=own), **endpoint) == "False app"


def test_only_the_process_setup_imports_the_sdk():
    """The core paths use the API alone: the SDK and the exporter are the ``otel`` extra's,
    imported by ``callgate/ops/telemetry.py`` only, when traces are wanted, and by the lab's
    micro-benchmark that measures the SDK's cost. (An installed SDK may still be loaded by a
    dependency: redis-py's observability module does.)"""
    root = Path(callgate.__file__).parent
    importers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.startswith(("opentelemetry.sdk", "opentelemetry.exporter")) for n in names):
                importers.add(path.relative_to(root).as_posix())
    assert importers == {"ops/telemetry.py", "ops/lab/bench/micro/tracing_overhead.py"}


def test_a_proposal_whose_enqueue_failed_says_so_with_the_code(exported):
    queued = tracing.Proposal("get_weather", "c1", "ref-1", "op-1", tracing.QUEUED)
    waiting = tracing.Proposal("send_email", "c2", "ref-2", "op-2", tracing.WAITING)
    with (
        pytest.raises(ServiceUnavailable),
        tracing.submitting(2) as submit,
        tracing.proposing(submit) as intake,
    ):
        intake.recorded("turn-1", [queued, waiting])
        raise ServiceUnavailable("Redis at 10.0.0.7 refused", code=ErrorCode.REDIS_UNAVAILABLE)
    spans = {s.name: s for s in exported.get_finished_spans()}
    failed = spans["callgate.propose get_weather"]
    assert failed.attributes["callgate.outcome"] == "not_enqueued"
    assert failed.attributes["error.type"] == "redis_unavailable"
    assert failed.status.status_code is StatusCode.ERROR
    assert spans["callgate.propose send_email"].attributes["callgate.outcome"] == "waiting"
    assert "10.0.0.7" not in repr([s.to_json() for s in spans.values()])
