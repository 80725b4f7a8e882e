"""callgate's spans under a pydantic-ai agent's own run span.

The agent is instrumented the way pydantic-ai's users do it (``instrument=`` with the
application's tracer provider, here the SDK's in-memory exporter); its model is a scripted
``FunctionModel`` (no network). The tools run in real worker processes, which export their
spans over OTLP/HTTP to a receiver in this test: one trace joins both sides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.models.instrumented import InstrumentationSettings

from callgate import AsyncProducer
from callgate.core.settings import Settings
from callgate.ops.stack import Stack
from callgate.producer.frameworks.pydantic_ai import CallgateToolset
from tests.acceptance.conftest import wait_until
from tests.acceptance.frameworks_support import database_url, fw_stack, support_context
from tests.acceptance.otlp_receiver import Receiver, receiver
from tests.acceptance.test_frameworks_pydantic_ai import scripted, tool_answers

__all__ = ["database_url", "fw_stack", "receiver"]  # fixtures, for pytest


def _ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names = []
    parent = span.parent
    while parent is not None and parent.span_id in by_id:
        above = by_id[parent.span_id]
        names.append(above.name)
        parent = above.parent
    return names


def test_callgates_spans_sit_under_the_agents_run(
    fw_stack: Callable[..., Stack],
    receiver: Receiver,
    service_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "the-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # the application's provider
    fw_stack(
        workers=2,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    context = support_context()
    model = scripted(
        ("c-w", "get_weather", {"city": "Seoul", "unit": "celsius"}),
        ("c-s", "get_stock", {"symbol": "NVDA"}),
    )

    async def main() -> Any:
        async with AsyncProducer.from_env(Settings.from_env(service_env)) as producer:
            agent = Agent(model, toolsets=[CallgateToolset(producer, context, timeout=30)])
            agent.instrument = InstrumentationSettings(tracer_provider=provider)
            return await agent.run("weather in Seoul and NVDA's price")

    result = asyncio.run(main())
    answers = tool_answers(result.all_messages())
    assert {k: kind for k, (kind, _) in answers.items()} == {"c-w": "return", "c-s": "return"}

    # The application's side, from the in-memory exporter.
    mine = memory.get_finished_spans()
    by_id = {s.context.span_id: s for s in mine}
    (run,) = [s for s in mine if s.parent is None]
    assert "agent" in run.name  # pydantic-ai's run span ("invoke_agent …" / "agent run")
    (submit,) = [s for s in mine if s.name == "callgate.submit"]
    assert submit.context.trace_id == run.context.trace_id
    chain = _ancestors(submit, by_id)
    print("callgate.submit <- " + " <- ".join(chain))
    assert chain[-1] == run.name  # under the run, through its tool span
    # The toolset follows the turn in short rounds (AsyncProducer.results, looking again for
    # calls parked for approval): no span per round; the framework's own tool span is the wait.
    assert [s.name for s in mine if s.name == "callgate.collect"] == []
    trace_id = trace.format_trace_id(run.context.trace_id)
    submit_id = trace.format_span_id(submit.context.span_id)

    # The workers' side, exported by other processes into the same trace.
    def executed() -> list[dict[str, Any]] | None:
        spans = [
            s
            for s in receiver.received()
            if s["service"] == "callgate-worker" and s["name"].startswith("execute_tool ")
        ]
        return spans if len(spans) == 2 else None

    tools = wait_until(executed, timeout=15, what="the workers' execute_tool spans")
    assert sorted(s["name"] for s in tools) == [
        "execute_tool get_stock",
        "execute_tool get_weather",
    ]
    assert {s["trace_id"] for s in tools} == {trace_id}
    assert {s["parent"] for s in tools} == {submit_id}
    assert sorted(s["attributes"]["gen_ai.tool.call.id"] for s in tools) == ["c-s", "c-w"]
