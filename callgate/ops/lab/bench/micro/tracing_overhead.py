"""Measure what callgate's spans cost on a delivery's hot path, the submit and the collect:
with no tracer provider (the default: every helper returns after one check) and with the SDK
and a batch processor whose exporter drops everything. Not a test; run by hand (it prints
numbers, it checks nothing):

    python -m callgate.ops.lab.bench.micro.tracing_overhead [noop|sdk]
"""

from __future__ import annotations

import sys
import timeit
import uuid
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from callgate.observe import tracing

REF, TURN = uuid.uuid4(), uuid.uuid4()
CONTEXT = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}


def delivery() -> None:
    """The calls the executor makes for one delivery that runs its handler."""
    with tracing.delivering(
        tool_name="get_weather",
        call_id="call-1",
        turn_id=TURN,
        operation_id="op-1",
        call_ref=REF,
        trace_context=CONTEXT,
        queue_wait_seconds=0.01,
    ) as spans:
        spans.stage(tracing.RESERVATION)
        spans.stamped({"tool": "get_weather"})
        spans.reserved(1, False)
        spans.stage(tracing.HANDLER)
        spans.stage(tracing.COMPLETION)
        spans.finish("succeeded", "succeeded", None, {"allowlist": "pass", "schema": "pass"})


PROPOSALS = [
    tracing.Proposal("get_weather", f"call-{i}", str(REF), f"op-{i}", tracing.QUEUED)
    for i in range(3)
]


def submit() -> None:
    """A submit of three reads: its span and one proposal span each."""
    with tracing.submitting(3) as span:
        tracing.carrier_of(span)
        tracing.submitted(span, TURN, False)
        with tracing.proposing(span) as intake:
            if intake.on:
                intake.recorded(TURN, PROPOSALS)


def collect() -> None:
    with tracing.collecting(TURN) as span:
        tracing.collected(span, complete=True, results=3, pending=0)


@contextmanager
def _empty() -> Any:
    yield


def reference() -> None:
    """An empty ``@contextmanager`` block: the machine's yardstick."""
    with _empty():
        pass


def best_ns(fn: Callable[[], None], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def sdk() -> None:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=1 << 20))
    trace.set_tracer_provider(provider)


def main(mode: str) -> None:
    number = 200_000
    if mode == "sdk":
        sdk()
        number = 20_000
    figures = {
        name: best_ns(fn, number)
        for name, fn in [
            ("delivery", delivery),
            ("submit", submit),
            ("collect", collect),
            ("reference", reference),
        ]
    }
    print(f"{mode}: " + ", ".join(f"{k} {v / 1000:.1f} µs" for k, v in figures.items()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "noop")
