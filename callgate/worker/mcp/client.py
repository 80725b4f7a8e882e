"""One session per MCP server per process, kept open across calls and restarted when it dies.

A ``Connection`` runs on the process's tool event loop (``callgate.worker.aio``): a
supervisor task starts the server (a stdio subprocess, or a streamable HTTP session),
initialises it, lists its tools, and keeps the session until the transport ends; then it
starts it again, with a growing pause between failed attempts. Calls share the session.

Each ``tools/call`` goes out under a JSON-RPC request id minted here (``callgate-…``), never
the provider's call id. Both directions of the transport are tapped, so the response is
handed back exactly as it came off the wire, for ``callgate.worker.mcp.results`` to check its id
and classify. A response whose id answers no request in flight is handed to the one call
waiting, if only one is, as the evidence of a mismatch; otherwise it is logged.

Each ``tools/call`` is traced as the MCP semantic conventions say
(``callgate.observe.mcp_spans``): a CLIENT span under the delivery's handler stage, whose W3C
context goes to the server in ``params._meta``. The SDK would trace the same request with a
span of its own (named differently, its error status describing the server's message) and
inject that span's context with every configured propagator, baggage included: for
callgate's own ``tools/call`` it is told not to (``_sdk_telemetry_off``), traced or not.

A stdio server's stderr goes to a pipe of its own, read line by line into the log under
``callgate.mcp.NAME``; its ``notifications/message`` log records go there too. Neither
ever touches the protocol stream (the server's stdout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO, cast

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared import jsonrpc_dispatcher
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from opentelemetry import trace
from opentelemetry.trace import Span

from callgate.core.errors import ErrorCode
from callgate.observe import mcp_spans
from callgate.store.mcp_catalog import ServerInfo
from callgate.worker.mcp import discovery
from callgate.worker.mcp.config import ServerConfig

log = logging.getLogger("callgate.mcp")

CLIENT_INFO = types.Implementation(name="callgate", version="1")
FIRST_RETRY_SECONDS = 0.2
MAX_RETRY_SECONDS = 5.0

ReadStream = Any  # the SDK's ReadStream[SessionMessage | Exception]
WriteStream = Any  # the SDK's WriteStream[SessionMessage]


class Unavailable(Exception):
    """The server could not answer: not running, the connection closed, or no answer in time.

    ``sent`` says whether the request left this process; if it did not, the server cannot
    have acted on it.
    """

    code = ErrorCode.UPSTREAM_UNAVAILABLE  # what the call fails with (and the span says)

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.message = message
        self.sent = sent


@dataclass(frozen=True)
class Listing:
    """What one discovery of a server found."""

    info: ServerInfo
    list_changed: bool
    tools: list[types.Tool]


@dataclass(frozen=True)
class Exchange:
    """One ``tools/call``: the request id callgate sent, and the response off the wire."""

    request_id: str
    response: dict[str, Any]
    stray: bool = False  # the response answers no request in flight


def new_request_id() -> str:
    """A fresh JSON-RPC request id: a string that never parses as an integer, so it never
    meets the SDK's own numbering."""
    return f"callgate-{uuid.uuid4().hex}"


# Set while callgate sends its own ``tools/call``: the SDK's dispatcher then starts no span and
# injects nothing (callgate's span and ``_meta`` stand for the request).
_SDK_TELEMETRY_OFF: ContextVar[bool] = ContextVar("callgate_mcp_sdk_telemetry_off", default=False)


def _sdk_telemetry_off() -> None:
    """Wrap the SDK dispatcher's span and injection helpers so that they stand aside while
    ``_SDK_TELEMETRY_OFF`` is set (only callgate's own ``tools/call``: any other request of
    the process, an application's own MCP client included, keeps the SDK's telemetry).

    A later SDK that moves them finds nothing to wrap here; the tracing tests then see its
    second span and fail, rather than a silent double span in production.
    """
    sdk_span = getattr(jsonrpc_dispatcher, "otel_span", None)
    sdk_inject = getattr(jsonrpc_dispatcher, "inject_trace_context", None)
    if not callable(sdk_span) or not callable(sdk_inject) or hasattr(sdk_span, "callgate"):
        return

    def otel_span(name: str, **kwargs: Any) -> AbstractContextManager[Span]:
        if _SDK_TELEMETRY_OFF.get():
            return nullcontext(trace.INVALID_SPAN)  # what the SDK sets on it goes nowhere
        result: AbstractContextManager[Span] = sdk_span(name, **kwargs)
        return result

    def inject_trace_context(meta: dict[str, Any]) -> None:
        if not _SDK_TELEMETRY_OFF.get():
            sdk_inject(meta)

    otel_span.callgate = True  # type: ignore[attr-defined]
    setattr(jsonrpc_dispatcher, "otel_span", otel_span)  # noqa: B010
    setattr(jsonrpc_dispatcher, "inject_trace_context", inject_trace_context)  # noqa: B010


_sdk_telemetry_off()


@contextlib.contextmanager
def _own_telemetry() -> Iterator[None]:
    token = _SDK_TELEMETRY_OFF.set(True)
    try:
        yield
    finally:
        _SDK_TELEMETRY_OFF.reset(token)


class _Wire:
    """Sees every message of one session in both directions."""

    def __init__(self, on_lost: Callable[[], None]) -> None:
        self._on_lost = on_lost
        self.in_flight: set[Any] = set()  # request ids sent and not yet answered
        self.sent: set[str] = set()  # callgate's own request ids that left this process
        self.responses: dict[str, dict[str, Any]] = {}
        self.watched: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.lost = anyio.Event()

    def outbound(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            self.in_flight.add(message.id)
            if isinstance(message.id, str) and message.id in self.watched:
                self.sent.add(message.id)

    def inbound(self, item: SessionMessage | Exception) -> None:
        if not isinstance(item, SessionMessage):
            return
        message = item.message
        if not isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return
        raw = message.model_dump(by_alias=True, mode="json")
        if message.id in self.in_flight:
            self.in_flight.discard(message.id)
            if isinstance(message.id, str) and message.id in self.watched:
                self.responses[message.id] = raw
            return
        # Answers nothing this session asked: evidence of a mismatch for the only call
        # waiting, if there is exactly one; otherwise it cannot be attributed.
        waiting = [f for f in self.watched.values() if not f.done()]
        if len(waiting) == 1:
            waiting[0].set_result(raw)
        else:
            log.warning("MCP response with an id no request is waiting for was dropped")

    def lose(self) -> None:
        """The transport ended: no call may use this session any more."""
        self._on_lost()
        self.lost.set()

    def watch(self, request_id: str) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.watched[request_id] = future
        return future

    def unwatch(self, request_id: str) -> None:
        future = self.watched.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()
        self.responses.pop(request_id, None)
        self.sent.discard(request_id)


class _TapRead:
    """The transport's read stream, with every item shown to the wire first."""

    def __init__(self, inner: ReadStream, wire: _Wire) -> None:
        self._inner = inner
        self._wire = wire

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except BaseException:
            self._wire.lose()
            raise
        self._wire.inbound(item)
        return item

    def __aiter__(self) -> _TapRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._wire.lose()
        await self._inner.aclose()

    async def __aenter__(self) -> _TapRead:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _TapWrite:
    """The transport's write stream, with every item shown to the wire first."""

    def __init__(self, inner: WriteStream, wire: _Wire) -> None:
        self._inner = inner
        self._wire = wire

    async def send(self, item: SessionMessage, /) -> None:
        self._wire.outbound(item)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _TapWrite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _StderrPipe:
    """A stdio server's stderr, read into the log line by line (never the protocol)."""

    def __init__(self, server: str) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = cast(TextIO, os.fdopen(write_fd, "w"))
        self._logger = logging.getLogger(f"callgate.mcp.{server}")
        threading.Thread(
            target=self._pump, args=(read_fd,), name=f"mcp-stderr-{server}", daemon=True
        ).start()

    def _pump(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "r", errors="replace") as lines:
            for line in lines:
                self._logger.info("stderr: %s", line.rstrip("\n"))


Listener = Callable[["Connection", Listing], Awaitable[None]]


class Connection:
    """The session with one MCP server, for this process."""

    def __init__(self, config: ServerConfig, on_listing: Listener) -> None:
        self.config = config
        self._on_listing = on_listing
        self._session: ClientSession | None = None
        self._dispatcher: JSONRPCDispatcher[Any] | None = None
        self._wire: _Wire | None = None
        self._ready = asyncio.Event()
        self._attempted = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._stderr = _StderrPipe(config.name) if config.transport == "stdio" else None
        self._logger = logging.getLogger(f"callgate.mcp.{config.name}")
        self.failure: str | None = None
        self.connections = 0  # sessions opened so far (1 + restarts)
        self._peer = mcp_spans.peer_of(config.url if config.transport != "stdio" else None)
        self._session_id: str | None = None  # streamable HTTP's Mcp-Session-Id, once sent

    def start(self) -> None:
        """Start the supervisor (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise())

    async def first_attempt(self) -> None:
        """Wait until the first connection attempt succeeded or failed."""
        await self._attempted.wait()

    async def stop(self) -> None:
        """End the session and stop the server."""
        self._stopping = True
        if self._wire is not None:
            self._wire.lose()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def call(
        self, tool: str, arguments: dict[str, Any], *, request_id: str, timeout: float
    ) -> Exchange:
        """Send one ``tools/call`` under ``request_id`` and return the response as received.

        Raises ``Unavailable`` when no response came (see its ``sent``). A JSON-RPC error
        response is returned like any other: classifying it is the caller's business.
        """
        with mcp_spans.calling(
            server=self.config.name, tool=tool, request_id=request_id, peer=self._peer
        ) as span:
            exchange = await self._call(span, tool, arguments, request_id, timeout)
            mcp_spans.answered(span, exchange.response, request_id=request_id, stray=exchange.stray)
            return exchange

    async def _call(
        self, span: Span, tool: str, arguments: dict[str, Any], request_id: str, timeout: float
    ) -> Exchange:
        session, dispatcher, wire = await self._live(timeout)
        mcp_spans.session(
            span, protocol_version=session.protocol_version, session_id=self._session_id
        )
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        meta = mcp_spans.meta(span)
        if meta is not None:
            # The trace context only: the request id, the name and the arguments are as
            # they were (``arguments`` is the caller's dict, not copied and not changed).
            params["_meta"] = meta
        stray = wire.watch(request_id)
        with _own_telemetry():  # the task below starts in this context: the SDK stands aside
            sending = asyncio.ensure_future(
                dispatcher.send_raw_request(
                    "tools/call", params, {"request_id": request_id, "timeout": timeout}
                )
            )
        try:
            done, _ = await asyncio.wait({sending, stray}, return_when=asyncio.FIRST_COMPLETED)
            if sending not in done:
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending
                return Exchange(request_id, stray.result(), stray=True)
            try:
                sending.result()
            except MCPError as exc:
                if request_id not in wire.responses:
                    raise self._unavailable(exc, request_id in wire.sent, timeout) from None
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise Unavailable(
                    f"the connection to MCP server {self.config.name!r} failed"
                    f" ({type(exc).__name__})",
                    sent=request_id in wire.sent,
                ) from None
            return Exchange(request_id, wire.responses[request_id])
        finally:
            if not sending.done():
                sending.cancel()
            wire.unwatch(request_id)

    def _unavailable(self, exc: MCPError, sent: bool, timeout: float) -> Unavailable:
        name = self.config.name
        if exc.code == REQUEST_TIMEOUT:
            return Unavailable(f"MCP server {name!r} did not answer within {timeout:g}s", sent=sent)
        if exc.code == CONNECTION_CLOSED:
            return Unavailable(f"MCP server {name!r} closed the connection", sent=sent)
        return Unavailable(f"MCP server {name!r} could not be asked ({exc.code})", sent=sent)

    async def _live(self, timeout: float) -> tuple[ClientSession, JSONRPCDispatcher[Any], _Wire]:
        wait = max(timeout, self.config.connect_timeout)
        try:
            await asyncio.wait_for(self._ready.wait(), wait)
        except TimeoutError:
            why = f": {self.failure}" if self.failure else ""
            raise Unavailable(
                f"MCP server {self.config.name!r} is not running{why}", sent=False
            ) from None
        assert self._session is not None and self._dispatcher is not None
        assert self._wire is not None
        return self._session, self._dispatcher, self._wire

    async def _supervise(self) -> None:
        pause = FIRST_RETRY_SECONDS
        while not self._stopping:
            opened = time.monotonic()
            try:
                await self._session_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server failed to start, or broke mid-session
                self.failure = _describe(exc)
                log.warning("MCP server %r: %s", self.config.name, self.failure)
            finally:
                self._ready.clear()
                self._session = self._dispatcher = self._wire = None
                self._attempted.set()
            if self._stopping:
                break
            if time.monotonic() - opened > MAX_RETRY_SECONDS:
                pause = FIRST_RETRY_SECONDS  # it ran a while: a fresh failure, not a loop
            log.warning("MCP server %r is down; starting it again", self.config.name)
            await asyncio.sleep(pause)
            pause = min(pause * 2.5, MAX_RETRY_SECONDS)

    async def _session_once(self) -> None:
        self._session_id = None
        async with self._transport() as (read, write):
            wire = _Wire(on_lost=self._ready.clear)
            dispatcher: JSONRPCDispatcher[Any] = JSONRPCDispatcher(
                _TapRead(read, wire), _TapWrite(write, wire)
            )
            session = ClientSession(
                dispatcher=dispatcher,
                message_handler=self._on_message,
                logging_callback=self._on_log,
                client_info=CLIENT_INFO,
            )
            async with session:
                with anyio.fail_after(self.config.connect_timeout):
                    initialized = await session.initialize()
                    tools = await discovery.list_tools(session)
                listing = Listing(
                    info=ServerInfo(
                        name=initialized.server_info.name,
                        version=initialized.server_info.version,
                        protocol_version=initialized.protocol_version,
                    ),
                    list_changed=bool(
                        initialized.capabilities.tools
                        and initialized.capabilities.tools.list_changed
                    ),
                    tools=tools,
                )
                await self._on_listing(self, listing)
                self.connections += 1
                self.failure = None
                self._session, self._dispatcher, self._wire = session, dispatcher, wire
                self._ready.set()
                self._attempted.set()
                await wire.lost.wait()
                self.failure = "the connection ended"

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[ReadStream, WriteStream]]:
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None and self._stderr is not None
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd,
            )
            async with stdio_client(params, errlog=self._stderr.writer) as streams:
                yield streams
            return
        assert config.url is not None
        async with (
            httpx2.AsyncClient(
                headers=dict(config.headers),
                timeout=httpx2.Timeout(config.connect_timeout, read=None),
                event_hooks={"response": [self._on_http_response]},
            ) as http,
            streamable_http_client(config.url, http_client=http) as streams,
        ):
            yield streams

    async def _on_http_response(self, response: httpx2.Response) -> None:
        """The session id the server assigned (the transport keeps it to itself), for the
        spans' ``mcp.session.id``."""
        session_id = response.headers.get("mcp-session-id")
        if session_id:
            self._session_id = session_id

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            session = self._session
            if session is not None:
                task = asyncio.get_running_loop().create_task(self._relist(session))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        elif isinstance(message, Exception):
            self._logger.warning("transport: %s", _describe(message))

    async def _on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self._logger.info("log %s: %s", params.level, params.data)

    async def _relist(self, session: ClientSession) -> None:
        """``notifications/tools/list_changed``: discover the tools again."""
        try:
            tools = await asyncio.wait_for(
                discovery.list_tools(session), self.config.connect_timeout
            )
            initialized = session.initialize_result
            info = ServerInfo(
                name=initialized.server_info.name if initialized else None,
                version=initialized.server_info.version if initialized else None,
                protocol_version=session.protocol_version,
            )
            await self._on_listing(self, Listing(info=info, list_changed=True, tools=tools))
        except Exception as exc:
            log.warning("MCP server %r: listing its tools again failed: %s", self.config.name, exc)


def _describe(exc: BaseException) -> str:
    """A one-line account of a failure, without a traceback."""
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
