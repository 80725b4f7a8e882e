"""OpenTelemetry spans: a call's trace crosses the queue from ``submit`` to its worker.

Only ``opentelemetry-api`` is used here: spans go to whatever tracer provider the process
has, the application's own or the one ``callgate/ops/telemetry.py`` sets from the ``OTEL_*``
variables. Without one, the API is a no-op and so is everything here: ``active()`` is checked
first, and no attribute is built, no context serialised, no span started.

The submit span's W3C context (``traceparent``, ``tracestate``) is stored with the turn; the
worker reads it with the call and starts ``execute_tool {name}`` (the GenAI semantic
conventions' span for running a tool) as its child, with one child span per stage.

Redaction: attributes are ids, names, verdicts, codes and counts. Never a result or an
exception's text (a handler's error may quote its arguments), and a call's arguments only
when ``CALLGATE_TRACE_ARGUMENTS=redacted`` asks for them, after callgate's redaction. The ids
and the tool name a client chose, in span names and attributes, pass the redactor too
(``redaction.redact_id``: redacted and cut to 200 characters).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import Token
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from callgate.tools import redaction

TRACER_NAME: Final = "callgate"

# The variables that ask a callgate process to export traces (``wanted``).
EXPORT_VARIABLES: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_EXPORTER",
)

# The stages of one delivery, each a child span of ``execute_tool {name}``.
QUEUE_WAIT: Final = "callgate.queue_wait"
GATE: Final = "callgate.gate"
RESERVATION: Final = "callgate.reservation"
HANDLER: Final = "callgate.handler"
COMPLETION: Final = "callgate.completion"

# W3C trace context only, whatever OTEL_PROPAGATORS says: what is stored with a turn is the
# trace's position (``traceparent``, ``tracestate``), never the caller's baggage, which may
# hold application data.
W3C: Final = TraceContextTextMapPropagator()

# The provider the cached tracer came from, held (not its id: a provider collected after a
# test swapped it may leave its id to the next one, which would get a dead tracer).
_cached: tuple[trace.TracerProvider, trace.Tracer] | None = None


def _tracer() -> trace.Tracer:
    """callgate's tracer from the current provider (one per provider: a test may swap it)."""
    global _cached
    provider = trace.get_tracer_provider()
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(TRACER_NAME))
    return cached[1]


_NO_PROVIDER: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def active() -> bool:
    """Is a real tracer provider set? False: every span here is skipped outright."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)


def described() -> str:
    """For a process's start line: whether its spans go anywhere."""
    if active():
        return "tracing on"
    return "tracing off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces)"


def flush(timeout_seconds: float = 2.0) -> None:
    """Export the spans a provider still holds, before a process ends without ``atexit``
    (``os._exit``). Nothing without a provider that buffers."""
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if callable(force_flush):
        force_flush(int(timeout_seconds * 1000))


def wanted(env: Mapping[str, str]) -> bool:
    """Do the ``OTEL_*`` variables ask for exported traces? (``OTEL_SDK_DISABLED=true`` and
    ``OTEL_TRACES_EXPORTER=none`` say no.)"""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in EXPORT_VARIABLES)


def service_name(role: str) -> str:
    """The default ``service.name`` of a callgate process (OTEL_SERVICE_NAME overrides)."""
    return f"callgate-{role}"


def carrier_of(span: Span) -> dict[str, str] | None:
    """``span``'s W3C context as the text map stored with a turn; None for no valid span
    (nothing traced: nothing stored)."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier or None


def submitting(calls: int) -> AbstractContextManager[Span]:
    """``callgate.submit``, a child of the caller's current span. Without a provider it
    yields the caller's current span (its context, if valid, is still stored with the turn
    and continued by the workers)."""
    if not active():
        return nullcontext(trace.get_current_span())
    return _submitting(calls)


@contextmanager
def _submitting(calls: int) -> Iterator[Span]:
    with (
        _tracer().start_as_current_span(
            "callgate.submit",
            kind=SpanKind.PRODUCER,
            attributes={"callgate.calls": calls},
            record_exception=False,
            set_status_on_exception=False,
        ) as span,
        _failures(span),
    ):
        yield span


@contextmanager
def _failures(span: Span) -> Iterator[None]:
    """An exception leaving ``span`` sets ``error.type`` to its error code (a callgate
    error's) or its class, and the ERROR status: never its text, which may quote input."""
    try:
        yield
    except BaseException as exc:
        _failed(span, exc)
        raise


def _failed(span: Span, exc: BaseException) -> None:
    code = getattr(exc, "code", None)
    span.set_attribute("error.type", str(code) if code else type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR))


def submitted(span: Span, turn_id: object, repeat: bool) -> None:
    if span.is_recording():
        span.set_attributes({"callgate.turn_id": str(turn_id), "callgate.repeat": repeat})


# A proposal's intake (``callgate.outcome`` of its ``callgate.propose`` span).
QUEUED: Final = "queued"  # enqueued by this submit
WAITING: Final = "waiting"  # a write recorded behind the turn's previous write
REFUSED: Final = "refused"  # ended at intake (a budget, a repeated call): never enqueued
REPEAT: Final = "repeat"  # a repeat of an earlier submit, which recorded the call
NOT_ENQUEUED: Final = "not_enqueued"  # recorded, but Redis refused the enqueue


@dataclass(frozen=True)
class Proposal:
    """One proposal as the submit recorded it, for its ``callgate.propose {tool}`` span."""

    tool_name: str
    call_id: str
    call_ref: str
    operation_id: str
    outcome: str  # QUEUED, WAITING, REFUSED or REPEAT
    code: str | None = None  # a refusal's error code


def _id(value: str) -> str:
    """An id or a tool name a client chose, as a span shows it."""
    return redaction.redact_id(value)


class Intake:
    """The ``callgate.propose`` spans of one submit: started once the turn is recorded;
    each ends when its outcome is final (a queued one when the enqueue returned)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self._queued: list[Span] = []

    def recorded(self, turn_id: object, proposals: Iterable[Proposal]) -> None:
        if not self.on:
            return
        tracer = _tracer()
        for p in proposals:
            tool_name = _id(p.tool_name)
            span = tracer.start_span(f"callgate.propose {tool_name}", kind=SpanKind.INTERNAL)
            if span.is_recording():
                span.set_attributes(
                    {
                        "gen_ai.tool.name": tool_name,
                        "gen_ai.tool.call.id": _id(p.call_id),
                        "callgate.turn_id": str(turn_id),
                        "callgate.call_ref": p.call_ref,
                        "callgate.operation_id": _id(p.operation_id),
                    }
                )
            if p.outcome == QUEUED:
                self._queued.append(span)
                continue
            span.set_attribute("callgate.outcome", p.outcome)
            if p.code is not None:
                # The call's terminal failure, decided here: it has no execute_tool span.
                span.set_attributes({"callgate.code": p.code, "error.type": p.code})
                span.set_status(Status(StatusCode.ERROR))
            span.end()

    def ended(self, error: BaseException | None) -> None:
        """The enqueue returned (``error`` None) or raised ``error``."""
        for span in self._queued:
            if error is None:
                span.set_attribute("callgate.outcome", QUEUED)
            else:
                span.set_attribute("callgate.outcome", NOT_ENQUEUED)
                _failed(span, error)
            span.end()
        self._queued.clear()


_NO_INTAKE: Final = Intake(False)
_UNTRACED_INTAKE: Final = nullcontext(_NO_INTAKE)


def proposing(submit: Span) -> AbstractContextManager[Intake]:
    """One ``callgate.propose {tool}`` span per proposal, children of ``submit`` (the current
    span). The context stored with the turn stays the submit span's: the workers'
    ``execute_tool`` spans are its children, not a proposal's. Nothing when the submit span
    does not record (no provider, or sampled out): no proposal is even listed."""
    return _proposing() if active() and submit.is_recording() else _UNTRACED_INTAKE


@contextmanager
def _proposing() -> Iterator[Intake]:
    intake = Intake(True)
    try:
        yield intake
    except BaseException as exc:
        intake.ended(exc)
        raise
    intake.ended(None)


def collecting(turn_id: object) -> AbstractContextManager[Span]:
    """``callgate.collect``: the fan-in wait of one turn."""
    return _collecting(turn_id) if active() else _UNTRACED_COLLECT


@contextmanager
def _collecting(turn_id: object) -> Iterator[Span]:
    with (
        _tracer().start_as_current_span(
            "callgate.collect",
            attributes={"callgate.turn_id": str(turn_id)},
            record_exception=False,
            set_status_on_exception=False,
        ) as span,
        _failures(span),
    ):
        yield span


def collected(span: Span, *, complete: bool, results: int, pending: int) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "callgate.complete": complete,
                "callgate.results": results,
                "callgate.pending": pending,
            }
        )


def streaming(turn_id: object, *, on: bool = True) -> AbstractContextManager[Span]:
    """``callgate.collect`` around an async generator's iteration (``AsyncProducer.results``).

    Never made current: the generator yields to its consumer, whose own spans must not nest
    under it, and it may be closed from another task (the loop's finalizer, after a
    ``break``), where a context attached here could not be detached. A consumer that stops
    early (``break``, ``aclose()``, a cancelled task) is no error. ``on=False``: no span."""
    return _streaming(turn_id) if on and active() else _UNTRACED_COLLECT


@contextmanager
def _streaming(turn_id: object) -> Iterator[Span]:
    span = _tracer().start_span("callgate.collect", attributes={"callgate.turn_id": str(turn_id)})
    try:
        yield span
    except (GeneratorExit, asyncio.CancelledError):
        raise
    except BaseException as exc:
        _failed(span, exc)
        raise
    finally:
        span.end()


def serving(method: str, headers: Iterable[tuple[bytes, bytes]]) -> AbstractContextManager[Span]:
    """An HTTP API request as a SERVER span: a child of the client's ``traceparent`` when it
    sent one, so a turn submitted over HTTP joins the client's trace like a library submit."""
    if not active():
        return nullcontext(trace.INVALID_SPAN)
    carrier = {
        k.decode("latin-1").lower(): v.decode("latin-1")
        for k, v in headers
        if k.lower() in (b"traceparent", b"tracestate")
    }
    return _serving(method, W3C.extract(carrier) if carrier else Context())


@contextmanager
def _serving(method: str, parent: Context) -> Iterator[Span]:
    with _tracer().start_as_current_span(
        method,
        context=parent,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def served(span: Span, method: str, route: str | None, status: int) -> None:
    """Name the server span by its route template (never the path: ids stay out of names)
    and record the status; a 5xx is an error (HTTP semantic conventions)."""
    if not span.is_recording():
        return
    if route:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def relayed(
    *,
    turn_id: object,
    call_ref: object,
    trace_context: Mapping[str, str],
    created: int,
    published: int,
    republished: bool,
) -> None:
    """``callgate.relay`` in the turn's trace: one result from its outbox row's commit
    (``created``) to its publish on Redis (``published``), both in ns since the epoch."""
    span = _tracer().start_span(
        "callgate.relay",
        context=W3C.extract(trace_context),
        kind=SpanKind.PRODUCER,
        start_time=created,
    )
    if span.is_recording():
        span.set_attributes(
            {
                "callgate.turn_id": str(turn_id),
                "callgate.call_ref": str(call_ref),
                "callgate.republished": republished,
            }
        )
    span.end(published)


class Delivery:
    """The spans of one delivery: ``execute_tool {name}`` and its current stage."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.on = span.is_recording()
        self._stage: Span | None = None
        self._token: Token[Context] | None = None

    def stage(self, name: str, start_time: int | None = None) -> None:
        """End the current stage and start ``name`` (current: a handler's own spans nest
        under it)."""
        if not self.on:
            return
        self.end_stage()
        self._stage = _tracer().start_span(
            name, context=trace.set_span_in_context(self.span), start_time=start_time
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._stage))

    def end_stage(self, end_time: int | None = None) -> None:
        if self._stage is None:
            return
        if self._token is not None:
            otel_context.detach(self._token)
        self._stage.end(end_time)
        self._stage, self._token = None, None

    def reserved(self, generation: int, takeover: bool) -> None:
        """The reservation's generation is this operation's attempt number."""
        if self.on:
            self.span.set_attributes(
                {
                    "callgate.generation": generation,
                    "callgate.attempt": generation,
                    "callgate.takeover": takeover,
                }
            )

    def stamped(self, detail: dict[str, Any]) -> dict[str, Any]:
        """``detail`` with this attempt's span context (``span_context``), for the
        reservation's trace event: a later takeover links to it."""
        carrier = carrier_of(self.span) if self.on else None
        return detail if carrier is None else {**detail, "span_context": carrier}

    def link(self, earlier: Iterable[Mapping[str, str]]) -> None:
        """Link this attempt to the attempts it took over (stored by ``stamped``)."""
        for carrier in earlier:
            context = trace.get_current_span(W3C.extract(carrier)).get_span_context()
            if context.is_valid:
                self.span.add_link(context, {"callgate.link": "earlier_attempt"})

    def finish(
        self,
        outcome: str,
        status: str | None,
        code: str | None,
        verdicts: Mapping[str, str],
    ) -> None:
        """The delivery's outcome, the call's status and error code, the gate's verdicts."""
        if not self.on:
            return
        self.end_stage()
        attributes: dict[str, str] = {"callgate.outcome": outcome}
        attributes.update({f"callgate.verdict.{layer}": v for layer, v in verdicts.items()})
        if status is not None:
            attributes["callgate.status"] = status
        if code is not None:
            attributes["callgate.code"] = code
        if status is not None and status != "succeeded":
            attributes["error.type"] = code or status
            self.span.set_status(Status(StatusCode.ERROR))
        self.span.set_attributes(attributes)


# One instance for every delivery that is not traced, and the (reusable) contexts that
# hand them out.
NOT_TRACED: Final = Delivery(trace.INVALID_SPAN)
_UNTRACED_DELIVERY: Final = nullcontext(NOT_TRACED)
_UNTRACED_COLLECT: Final = nullcontext(trace.INVALID_SPAN)


def delivering(
    *,
    tool_name: str,
    call_id: str,
    turn_id: object,
    operation_id: str,
    call_ref: object,
    trace_context: Mapping[str, str] | None,
    queue_wait_seconds: float | None,
    arguments: Any = None,
) -> AbstractContextManager[Delivery]:
    """``execute_tool {tool_name}``, a child of the submit span stored with the turn. It
    starts when the call was dispatched (its first stage is the queue wait) and the gate
    stage follows. An exception that escapes sets ``error.type`` to its class name (never
    its text). ``arguments`` (the call's, given only when ``CALLGATE_TRACE_ARGUMENTS`` is
    ``redacted``) become ``gen_ai.tool.call.arguments`` once redacted."""
    if not active():
        return _UNTRACED_DELIVERY
    return _delivering(
        tool_name,
        call_id,
        turn_id,
        operation_id,
        call_ref,
        trace_context,
        queue_wait_seconds,
        arguments,
    )


def redacted_arguments(arguments: Any) -> str:
    """A call's arguments as a span records them: callgate's redaction (the one results,
    logs and the audit trace pass through) first, then JSON. Arguments the model sent as a
    string that was not JSON stay that string, redacted."""
    cleaned = redaction.redact_value(arguments)
    if isinstance(cleaned, str):
        return cleaned
    return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"), default=str)


@contextmanager
def _delivering(
    tool_name: str,
    call_id: str,
    turn_id: object,
    operation_id: str,
    call_ref: object,
    trace_context: Mapping[str, str] | None,
    queue_wait_seconds: float | None,
    arguments: Any,
) -> Iterator[Delivery]:
    now = time.time_ns()
    dispatched = None
    if queue_wait_seconds is not None and queue_wait_seconds >= 0:
        dispatched = now - int(queue_wait_seconds * 1e9)
    parent = W3C.extract(trace_context) if trace_context else None
    tool_name = _id(tool_name)
    with _tracer().start_as_current_span(
        f"execute_tool {tool_name}",
        context=parent,
        start_time=dispatched,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        spans = Delivery(span)
        if spans.on:
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool_name,
                    "gen_ai.tool.call.id": _id(call_id),
                    "gen_ai.tool.type": "function",
                    "callgate.turn_id": str(turn_id),
                    "callgate.operation_id": _id(operation_id),
                    "callgate.call_ref": str(call_ref),
                }
            )
            if arguments is not None:
                span.set_attribute("gen_ai.tool.call.arguments", redacted_arguments(arguments))
            if dispatched is not None:
                spans.stage(QUEUE_WAIT, start_time=dispatched)
                spans.end_stage(now)
            spans.stage(GATE)
        try:
            with _failures(span):
                yield spans
        finally:
            spans.end_stage()
