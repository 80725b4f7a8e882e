"""The MCP client semantic conventions: each ``tools/call`` callgate sends is a CLIENT span
``tools/call {tool}`` under the delivery's ``callgate.handler`` stage, and its W3C context
reaches the server in ``params._meta``.

Real server processes (the tests' recording server over stdio and over streamable HTTP, and
the misbehaving raw server), called through their tools' handlers in this process on the
worker's tool event loop, as a worker's delivery calls them; the spans go to the SDK's
in-memory exporter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from callgate.core.errors import ToolError
from callgate.core.settings import Settings
from callgate.tools.registry import ExecutionContext, Registry, Tool
from callgate.worker import aio
from callgate.worker.mcp import hub
from tests.acceptance.mcp_world import World, make_world, recording_http_server

CTX = ExecutionContext(
    tenant_id="t",
    user_id="u",
    operation_id="op-mcp-span",
    idempotency_key="k",
    fencing_token=1,
    request_id="r",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(tmp_path_factory.mktemp("mcpspan"), servers=("rec", "hung", "raw"))


@pytest.fixture(scope="module")
def tools(world: World) -> Iterator[dict[str, Tool]]:
    settings = Settings.from_env({"CALLGATE_MCP_CONFIG": str(world.config)})
    registry, _ = hub.with_mcp_tools(Registry({}), settings)
    yield dict(registry.tools)
    hub.close_all()


def _deliver(tool: Tool, args: dict[str, Any]) -> Any:
    """Run ``tool``'s handler as a worker's delivery does: in the ``callgate.handler`` stage
    of ``execute_tool``, on the tool event loop."""
    from callgate.observe import tracing

    with tracing.delivering(
        tool_name=tool.name,
        call_id="call-1",
        turn_id=uuid.uuid4(),
        operation_id=CTX.operation_id,
        call_ref=uuid.uuid4(),
        trace_context=None,
        queue_wait_seconds=None,
    ) as spans:
        spans.stage(tracing.HANDLER)
        return aio.call(tool.handler, args, CTX)


def _received(path: Path, tool: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line for line in lines if line["tool"] == tool]


def _client_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]


def _handler_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (handler,) = [s for s in exporter.get_finished_spans() if s.name == "callgate.handler"]
    return handler


def _traceparent(meta: dict[str, Any] | None) -> tuple[str, str]:
    """(trace id, parent span id) of the ``traceparent`` in ``meta``."""
    assert meta is not None and "traceparent" in meta, meta
    version, trace_id, span_id, _flags = meta["traceparent"].split("-")
    assert version == "00"
    return trace_id, span_id


def test_a_traced_call_is_one_client_span_under_the_handler_and_its_context_reaches_the_server(
    tools: dict[str, Tool], world: World, exported: InMemorySpanExporter
) -> None:
    marker = f"m-{uuid.uuid4().hex[:10]}"
    answer = _deliver(tools["rec__echo"], {"text": marker})
    assert answer["structuredContent"] == {"echo": marker}

    (span,) = _client_spans(exported)  # one: the SDK's own client span is not added
    handler = _handler_span(exported)
    assert span.name == "tools/call echo"
    assert span.parent is not None and span.parent.span_id == handler.context.span_id
    assert span.context.trace_id == handler.context.trace_id
    attributes = dict(span.attributes or {})
    request_id = attributes.pop("jsonrpc.request.id")
    assert isinstance(request_id, str) and request_id.startswith("callgate-")
    protocol = attributes.pop("mcp.protocol.version")
    assert isinstance(protocol, str) and protocol
    assert attributes == {
        "mcp.method.name": "tools/call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo",
        "network.transport": "pipe",
        "callgate.mcp.server": "rec",
    }
    assert span.status.status_code == StatusCode.UNSET
    assert marker not in json.dumps(
        [dict(s.attributes or {}) for s in exported.get_finished_spans()]
    )

    # The server got the call's arguments unchanged, and the client span as its parent.
    (received,) = [r for r in _received(world.record, "echo") if r["arguments"] == {"text": marker}]
    trace_id, parent_id = _traceparent(received["meta"])
    assert int(trace_id, 16) == span.context.trace_id
    assert int(parent_id, 16) == span.context.span_id
    assert set(received["meta"]) <= {"traceparent", "tracestate"}  # never the baggage


def test_a_json_rpc_error_is_the_span_s_error_type_by_its_code_and_the_id_is_the_one_sent(
    tools: dict[str, Tool], world: World, exported: InMemorySpanExporter
) -> None:
    before = len(_received(world.raw_record, "invalid"))
    with pytest.raises(ToolError) as raised:
        _deliver(tools["raw__invalid"], {})
    assert raised.value.code == "mcp_invalid_params"

    (span,) = _client_spans(exported)
    assert span.name == "tools/call invalid"
    attributes = span.attributes or {}
    assert attributes["error.type"] == "-32602"
    assert attributes["rpc.response.status_code"] == "-32602"
    assert span.status.status_code == StatusCode.ERROR
    assert not span.status.description  # never the server's message
    assert not span.events
    (received,) = _received(world.raw_record, "invalid")[before:]
    assert received["id"] == attributes["jsonrpc.request.id"]
    trace_id, parent_id = _traceparent(received["meta"])
    assert (int(trace_id, 16), int(parent_id, 16)) == (span.context.trace_id, span.context.span_id)


def test_a_tool_error_result_is_error_type_tool_error(
    tools: dict[str, Tool], exported: InMemorySpanExporter
) -> None:
    with pytest.raises(ToolError):
        _deliver(tools["rec__fail"], {"code": "invalid_arguments"})
    (span,) = _client_spans(exported)
    assert (span.attributes or {})["error.type"] == "tool_error"
    assert "rpc.response.status_code" not in (span.attributes or {})
    assert span.status.status_code == StatusCode.ERROR and not span.status.description


def test_no_answer_in_time_is_error_type_upstream_unavailable(
    tools: dict[str, Tool], exported: InMemorySpanExporter
) -> None:
    with pytest.raises(ToolError) as raised:
        _deliver(tools["hung__slow"], {"seconds": 3})
    assert raised.value.code == "upstream_unavailable"
    (span,) = _client_spans(exported)
    assert span.name == "tools/call slow"
    assert (span.attributes or {})["error.type"] == "upstream_unavailable"
    assert span.status.status_code == StatusCode.ERROR and not span.status.description
    assert not span.events  # no exception event (its text may quote input)


def test_without_a_provider_no_trace_context_is_sent(tools: dict[str, Tool], world: World) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    marker = f"m-{uuid.uuid4().hex[:10]}"
    _deliver(tools["rec__echo"], {"text": marker})
    (received,) = [r for r in _received(world.record, "echo") if r["arguments"] == {"text": marker}]
    assert "traceparent" not in (received["meta"] or {})


def test_over_http_the_span_names_the_server_and_the_session(
    tmp_path: Path, exported: InMemorySpanExporter
) -> None:
    with recording_http_server(tmp_path) as (port, record):
        config = tmp_path / "mcp.json"
        config.write_text(
            json.dumps({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}})
        )
        settings = Settings.from_env({"CALLGATE_MCP_CONFIG": str(config)})
        registry, _ = hub.with_mcp_tools(Registry({}), settings)
        try:
            _deliver(registry.tools["web__echo"], {"text": "one"})
            _deliver(registry.tools["web__echo"], {"text": "two"})
        finally:
            hub.shared(hub.mcp_config.load(str(config)), None).close()

    # (the SDK traces the session's own initialize and tools/list: not callgate's requests)
    spans = [s for s in _client_spans(exported) if s.name == "tools/call echo"]
    first, second = sorted(spans, key=lambda s: s.start_time or 0)
    attributes = first.attributes or {}
    assert attributes["network.transport"] == "tcp"
    assert attributes["network.protocol.name"] == "http"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == port
    session = attributes["mcp.session.id"]
    assert isinstance(session, str) and session
    assert (second.attributes or {})["mcp.session.id"] == session  # one session, both calls
    received = [json.loads(line) for line in record.read_text().splitlines()]
    assert [_traceparent(r["meta"])[1] for r in received] == [
        format(s.context.span_id, "016x") for s in (first, second)
    ]
