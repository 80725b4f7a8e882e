"""uvicorn as ``callgate api`` and ``callgate mcp-gateway --http`` run it.

uvicorn times out an idle keep-alive connection (``timeout_keep_alive``), but never a request
head: a connection that opens and sends part of its headers, or nothing, is kept open for as
long as the client likes (uvicorn has no header timeout, and h11 only caps the head's size).
A few hundred such sockets hold file descriptors and memory at no cost to the sender. The
protocol here is uvicorn's h11 protocol with one timer more: armed when a connection opens
and whenever the bytes of a new request head start arriving, disarmed when the head is whole,
and closing the connection when it fires. A reverse proxy in front should enforce its own
limits too (docs/api.md); this one holds without it.

Nor does uvicorn time out a request body: a client that sends a head declaring a body and
then trickles it (a byte now and then cancels the keep-alive timer) holds its connection as
long as it likes, even after it was answered 401 without a byte of the body read. So a second
timer: armed when a head declaring a body is whole, disarmed when the body is; when it fires,
the request is answered ``408 body_timeout`` (unless an answer began) and the connection
closed. And a request answered before its body was whole (a 401, a 413) has its connection
closed at once: nothing more of that body is read or waited for.

h11 is chosen explicitly (not ``auto``), so installing httptools never silently drops the
guard.

The connection under it is ``callgate.ops.http_framing.StrictConnection``: a request two
parsers could read two ways (a bare LF, a folded header, Content-Length with chunked, a
second Authorization) is answered 400 and the connection closed before the app sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from callgate.core.errors import ErrorCode
from callgate.ops import http_framing

log = logging.getLogger("callgate.http")

# uvicorn.run's exit code when the server did not start (its own constant is not importable:
# uvicorn.main is the click command).
STARTUP_FAILURE = 3

# h11's own cap on a request head (bytes): a bigger one is answered 400.
MAX_HEAD_BYTES = 16 * 1024


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol that closes a connection whose request head is not whole
    ``header_timeout`` seconds after it began (or after the connection opened), answers 408
    a request whose body is not whole ``body_timeout`` seconds after its head, and closes a
    connection whose request was answered before its body was whole."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_of: object = None  # the request cycle the body timer is for
        size = self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES
        self.conn = http_framing.StrictConnection(h11.SERVER, size)

    def send_400_response(self, msg: str) -> None:
        # A problem naming the rule broken, not uvicorn's plain-text line; then hang up.
        self.transport.write(http_framing.answer_400(self.conn))
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:
            self._disarm()  # a head arrived whole: the request is the app's now
        elif self.conn.their_state is h11.IDLE and self._head_timer is None:
            # Bytes of a new head on a connection between requests (uvicorn cancelled its
            # keep-alive timer on them): the head gets header_timeout from now to be whole.
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        # Every new request passes here (from data_received, or a pipelined one once the
        # previous answer is complete), as does every piece of a body.
        super().handle_events()
        self._watch_body()

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            # Answered before its body was whole (401, 413, a route that reads none): reading
            # the rest would only serve whoever sends it, slowly or not at all.
            self._disarm_body()
            self.transport.close()
        super().on_response_complete()  # counts the request; starts nothing once closing

    def _watch_body(self) -> None:
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            self._disarm_body()
        elif self._body_timer is None or self._body_of is not self.cycle:
            self._disarm_body()
            self._body_of = self.cycle
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_timed_out)

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        log.debug("closing a connection whose request body took over %ss", self.body_timeout)
        cycle = self.cycle
        if self.conn.our_state is h11.SEND_RESPONSE and not (cycle and cycle.response_started):
            detail = http_framing.body_timeout_detail(self.body_timeout)
            self.transport.write(
                http_framing.answer(self.conn, 408, ErrorCode.BODY_TIMEOUT, detail)
            )
        if cycle is not None:
            # The app's next receive is a disconnect, and whatever it answers is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.debug("closing a connection whose request head took over %ss", self.header_timeout)
            self.transport.close()


def protocol(header_timeout: float, body_timeout: float = 30.0) -> type[HeaderTimeoutH11]:
    """The protocol class for uvicorn's ``http=`` with these timeouts."""
    timeouts = {"header_timeout": header_timeout, "body_timeout": body_timeout}
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), timeouts)


def run(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout: float,
    keep_alive: int,
    body_timeout: float = 30.0,
    on_started: Callable[[], None] | None = None,
    on_stopped: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` with uvicorn, its head, body and keep-alive timeouts set; ``on_started`` runs
    once the socket is bound and the app started (never when either failed), ``on_stopped``
    once a started server shut down (uvicorn raises SIGTERM again after ``run`` returns, so
    nothing after ``run`` would be reached)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol(header_timeout, body_timeout),
        timeout_keep_alive=keep_alive,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        log_level="warning",
        # callgate writes its own line per request (callgate/ops/http/access.py).
        access_log=False,
        # The console's cookie is Secure when the request is HTTPS; behind a proxy that
        # terminates TLS, uvicorn takes the scheme from X-Forwarded-Proto of trusted proxies
        # (FORWARDED_ALLOW_IPS, default 127.0.0.1).
        proxy_headers=True,
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit and on_started is not None:
                on_started()

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets=sockets)
            if on_stopped is not None:
                on_stopped()

    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        # uvicorn logged why (the app's start-up failed, or the address is taken).
        sys.exit(STARTUP_FAILURE)
