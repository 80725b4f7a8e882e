"""One log line per request, through callgate's logging (callgate/core/logs.py).

uvicorn's own access log is off (callgate/ops/http_server.py): it would write a second line in
another format, with the client's address and the query string. This line has what an
operator needs and nothing a request carries: method, path, status, duration and the id of
the key that was checked (``ak…``, never the key, the Authorization header, a cookie, the
query or the body). A path is escaped (``values.printable``), so it cannot forge a line.

Health probes (``/healthz``, ``/readyz``) are logged at DEBUG: a load balancer asks every few
seconds, and a line each would bury the requests. With a tracer provider, every other request
is a SERVER span (``callgate.observe.tracing.serving``), a child of the client's
``traceparent``; the line is written inside it, so it carries the trace's ids.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Final

from opentelemetry import trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callgate.core import values
from callgate.observe import tracing

log = logging.getLogger("callgate.api")

PROBES: Final = frozenset({"/healthz", "/readyz"})
# Where the routes leave the id of the key they checked (scope["state"], Starlette's
# request.state), for this line.
KEY_ID_STATE: Final = "callgate_key_id"


def access_line(method: str, path: str, status: int, duration_ms: float, key_id: str | None) -> str:
    """``GET /v1/approvals 200 3.1ms key ak…`` (``key -`` when no key was checked)."""
    return (
        f"{values.printable(method, 16)} {values.printable(path, 200)} {status} "
        f"{duration_ms:.1f}ms key {values.printable(key_id, 40) if key_id else '-'}"
    )


class AccessLog:
    """The outermost layer: times the whole request, answers of every other layer included
    (a refused body, an unexpected 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Made here, so the dict the routes write the key id into is the one read below.
        state: dict[str, object] = scope.setdefault("state", {})
        started = time.monotonic()
        status = 0

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        path: str = scope["path"]
        traced = (
            tracing.serving(scope["method"], scope.get("headers", ()))
            if path not in PROBES
            else nullcontext(trace.INVALID_SPAN)
        )
        with traced as span:
            try:
                await self.app(scope, receive, noting_send)
            finally:
                key_id = state.get(KEY_ID_STATE)
                # No answer started: the app raised past every handler, or the client left.
                code = status or 500
                route = getattr(scope.get("route"), "path", None)
                tracing.served(span, scope["method"], route, code)
                level = logging.DEBUG if path in PROBES else logging.INFO
                if log.isEnabledFor(level):
                    duration_ms = round((time.monotonic() - started) * 1000, 1)
                    log.log(
                        level,
                        access_line(
                            scope["method"],
                            path,
                            code,
                            duration_ms,
                            str(key_id) if key_id else None,
                        ),
                        extra={"event": "request", "status": code, "duration_ms": duration_ms},
                    )
