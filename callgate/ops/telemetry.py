"""A callgate process's tracer provider, from the standard ``OTEL_*`` variables.

When ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_TRACES_EXPORTER`` is set, the ``otel`` extra is installed and nobody set a provider
yet, a CLI process (worker, relayer, sweeper, api, …) sets one: the resource from
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (``service.name`` defaults to
``callgate-<command>``), the sampler from ``OTEL_TRACES_SAMPLER`` (the SDK reads it), and a
``BatchSpanProcessor`` exporting over OTLP/HTTP (the exporter reads its endpoint, headers
and timeout from the environment). The spans still queued are flushed when the process
stops. A library user's own provider is used as it is: nothing here runs in a library.

The SDK is only imported here, and only when traces are wanted.
"""

from __future__ import annotations

import atexit
import logging
import os

from opentelemetry import trace

from callgate.observe import tracing

log = logging.getLogger("callgate.telemetry")

_OTLP = ("otlp", "otlp_proto_http")


def setup(role: str) -> bool:
    """Set the process's tracer provider if the environment asks for one. True if set."""
    env = os.environ
    if not tracing.wanted(env) or tracing.active():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces, but the OpenTelemetry SDK is not installed: "
            "pip install 'callgate[otel]'; no traces are exported"
        )
        return False
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[SpanExporter] = []
    for name in filter(None, names):
        if name in _OTLP:
            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s is not supported here (otlp, console)", name)
    if not exporters:
        return False
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: tracing.service_name(role)}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # flush the spans still queued at a clean stop
    return True
