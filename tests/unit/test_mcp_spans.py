"""The MCP client span's pure parts: how a response reads as ``error.type``, where a server
is, and the untraced path (no provider: nothing started, nothing to send)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace

from callgate.observe import mcp_spans

RID = "callgate-1"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ({"jsonrpc": "2.0", "id": RID, "result": {"content": []}}, (None, None)),
        ({"jsonrpc": "2.0", "id": RID, "result": {"isError": False}}, (None, None)),
        ({"jsonrpc": "2.0", "id": RID, "result": {"isError": True}}, ("tool_error", None)),
        ({"jsonrpc": "2.0", "id": RID, "error": {"code": -32602}}, ("-32602", "-32602")),
        ({"jsonrpc": "2.0", "id": RID, "error": {"code": "x"}}, ("mcp_wire_error", None)),
        ({"jsonrpc": "2.0", "id": RID, "error": {"code": True}}, ("mcp_wire_error", None)),
        ({"jsonrpc": "2.0", "id": RID, "result": []}, ("mcp_wire_error", None)),
        ({"jsonrpc": "1.0", "id": RID, "result": {}}, ("mcp_wire_error", None)),
        ({"jsonrpc": "2.0", "id": RID}, ("mcp_wire_error", None)),
        ({"jsonrpc": "2.0", "id": "other", "result": {}}, ("mcp_response_id_mismatch", None)),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, ("mcp_response_id_mismatch", None)),
    ],
)
def test_a_response_reads_as_its_error_type(
    response: dict[str, Any], expected: tuple[str | None, str | None]
) -> None:
    assert mcp_spans.outcome(response, request_id=RID, stray=False) == expected


def test_a_stray_answer_is_an_id_mismatch_whatever_it_says() -> None:
    response = {"jsonrpc": "2.0", "id": RID, "result": {}}
    assert mcp_spans.outcome(response, request_id=RID, stray=True)[0] == (
        "mcp_response_id_mismatch"
    )


def test_where_a_server_is() -> None:
    assert mcp_spans.peer_of(None) == mcp_spans.Peer("pipe")
    assert mcp_spans.peer_of("http://mcp.internal:8080/mcp") == mcp_spans.Peer(
        "tcp", "http", "mcp.internal", 8080
    )
    assert mcp_spans.peer_of("https://mcp.example.com/mcp").port == 443
    assert mcp_spans.peer_of("http://[::1]/mcp") == mcp_spans.Peer("tcp", "http", "::1", 80)
    assert mcp_spans.peer_of("http://h:bad/mcp") == mcp_spans.Peer("tcp", "http", "h", None)


def test_without_a_provider_nothing_is_started_and_nothing_is_sent() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with mcp_spans.calling(server="s", tool="t", request_id=RID, peer=mcp_spans.STDIO) as span:
        assert span is trace.INVALID_SPAN
        assert trace.get_current_span() is trace.INVALID_SPAN  # nothing was attached
        assert mcp_spans.meta(span) is None
        mcp_spans.session(span, protocol_version="2025-11-25", session_id="s-1")
        mcp_spans.answered(
            span, {"jsonrpc": "2.0", "id": RID, "error": {"code": -1}}, request_id=RID, stray=False
        )
