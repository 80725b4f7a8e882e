"""The client side of OpenTelemetry's MCP semantic conventions: each ``tools/call`` callgate
sends to an MCP server is a CLIENT span ``tools/call {gen_ai.tool.name}``, a child of the
current span (the delivery's ``callgate.handler`` stage), and its W3C context goes to the
server in the request's ``params._meta`` (the conventions' propagation, SEP-414), so the
server's own span continues callgate's trace.

Like ``callgate.observe.tracing``: without a tracer provider, one check and a shared
``nullcontext``; nothing is built, nothing injected. Redaction as there too: ids, names and
codes; never an argument, a result, or an error's message (a server's message may quote the
arguments), so the error status has no description and no exception event is added.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from callgate.observe import tracing

TOOLS_CALL: Final = "tools/call"
# The conventions' error.type for a result that says ``isError: true``.
TOOL_ERROR: Final = "tool_error"
# callgate's error codes (callgate.core.errors.ErrorCode), by value: the same words a call
# that ends this way carries.
ID_MISMATCH: Final = "mcp_response_id_mismatch"
WIRE_ERROR: Final = "mcp_wire_error"


@dataclass(frozen=True)
class Peer:
    """Where a server is, as the conventions' network attributes say it."""

    transport: str  # network.transport: "pipe" (stdio) or "tcp" (HTTP)
    protocol: str | None = None  # network.protocol.name
    address: str | None = None
    port: int | None = None


STDIO: Final = Peer("pipe")


def peer_of(url: str | None) -> Peer:
    """A stdio server (no URL) is a pipe; an HTTP server is TCP to its host and port (the
    scheme's default port when the URL names none)."""
    if url is None:
        return STDIO
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is not a number: say nothing of it
        port = None
    return Peer("tcp", "http", parts.hostname or None, port if parts.hostname else None)


_UNTRACED: Final = nullcontext(trace.INVALID_SPAN)


def calling(*, server: str, tool: str, request_id: str, peer: Peer) -> AbstractContextManager[Span]:
    """``tools/call {tool}`` (kind CLIENT) around one request, current while it is sent so
    its context is the one ``meta`` hands the server. ``tool`` is the tool's name on its
    server (the name the request carries); ``server`` the configuration's name for it."""
    if not tracing.active():
        return _UNTRACED
    return _calling(server, tool, request_id, peer)


@contextmanager
def _calling(server: str, tool: str, request_id: str, peer: Peer) -> Iterator[Span]:
    attributes: dict[str, str | int] = {
        "mcp.method.name": TOOLS_CALL,
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "jsonrpc.request.id": request_id,
        "network.transport": peer.transport,
        "callgate.mcp.server": server,
    }
    if peer.protocol is not None:
        attributes["network.protocol.name"] = peer.protocol
    if peer.address is not None:
        attributes["server.address"] = peer.address
        if peer.port is not None:
            attributes["server.port"] = peer.port
    # tracing's tracer (one per provider): the same instrumentation scope as the delivery's.
    with tracing._tracer().start_as_current_span(
        f"{TOOLS_CALL} {tool}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            # No answer (not running, the connection dropped, no answer in time): the code
            # the call fails with (``upstream_unavailable``), else the exception's class.
            code = getattr(exc, "code", None)
            _failed(span, str(code) if code else type(exc).__qualname__)
            raise


def session(span: Span, *, protocol_version: str | None, session_id: str | None) -> None:
    """What the live session says: the negotiated protocol version, and the transport's
    session id (streamable HTTP's ``Mcp-Session-Id``; stdio has none)."""
    if not span.is_recording():
        return
    if protocol_version:
        span.set_attribute("mcp.protocol.version", str(protocol_version))
    if session_id:
        span.set_attribute("mcp.session.id", session_id)


def meta(span: Span) -> dict[str, str] | None:
    """The ``params._meta`` entries that carry ``span``'s context to the server: W3C
    ``traceparent`` and ``tracestate``, unprefixed as the conventions say, and never the
    baggage (application data). None when nothing is traced."""
    return tracing.carrier_of(span) if span.is_recording() else None


def answered(span: Span, response: Mapping[str, Any], *, request_id: str, stray: bool) -> None:
    """Record how the server answered (``outcome``) on the span."""
    if not span.is_recording():
        return
    error_type, status_code = outcome(response, request_id=request_id, stray=stray)
    if status_code is not None:
        span.set_attribute("rpc.response.status_code", status_code)
    if error_type is not None:
        _failed(span, error_type)


def outcome(
    response: Mapping[str, Any], *, request_id: str, stray: bool
) -> tuple[str | None, str | None]:
    """``(error.type, rpc.response.status_code)`` of one response; ``(None, None)`` for a
    result. A JSON-RPC error is its code, as a string (the conventions' ``error.type`` and
    status code both); ``isError: true`` is ``tool_error``; an answer to another request or
    one that is not JSON-RPC is callgate's error code for it. Pure."""
    if stray or not _same_id(response.get("id"), request_id):
        return ID_MISMATCH, None
    if response.get("jsonrpc") != "2.0" or ("error" in response) == ("result" in response):
        return WIRE_ERROR, None
    error = response.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, Mapping) else None
        if isinstance(code, int) and not isinstance(code, bool):
            return str(code), str(code)
        return WIRE_ERROR, None
    result = response.get("result")
    if not isinstance(result, Mapping):
        return WIRE_ERROR, None
    if result.get("isError") is True:
        return TOOL_ERROR, None
    return None, None


def _same_id(response_id: object, request_id: str) -> bool:
    return type(response_id) is type(request_id) and response_id == request_id


def _failed(span: Span, error_type: str) -> None:
    # No description: the conventions would put the server's message there, which may quote
    # the arguments (redaction wins).
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR))
