"""The ASGI app of ``callgate api`` and the services its routes share."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callgate.core.errors import ErrorCode, InputError
from callgate.core.settings import Settings
from callgate.ops.http import console, problems, routes
from callgate.ops.http.access import AccessLog
from callgate.ops.http.auth import RateLimiter, WaitSlots
from callgate.ops.http.services import Services
from callgate.ops.http.settings import SMALL_BODY_BYTES, ApiSettings
from callgate.producer import Producer
from callgate.producer.async_producer import AsyncProducer
from callgate.queue import transport

log = logging.getLogger("callgate.api")

DESCRIPTION = """\
Submit a model's proposed tool calls, collect their correlated results, list the tools a
principal may be shown, decide approval requests and read audit traces.

Every request carries `Authorization: Bearer KEY` (`callgate keys create`); its tenant, user
and roles come from the key, never from the body. Errors are RFC 9457 problem details
(`application/problem+json`) with callgate's stable `code`.
"""


# A JSON answer loads nothing and is framed by no one. /docs, when it is on, loads Swagger UI
# and runs its inline start-up script, so it gets only the framing rule.
API_CSP = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'"
DOCS_CSP = b"frame-ancestors 'none'"


class SecurityHeaders:
    """Headers on every answer, errors included: no MIME sniffing (a JSON body carrying
    markup is never run as a page), no framing (no clickjacking of the console's buttons),
    no referrer; and ``no-store`` on ``/v1`` and ``/console``, whose answers are one
    principal's (a shared cache must not keep them)."""

    def __init__(self, app: ASGIApp, *, docs_path: str | None) -> None:
        self.app = app
        self.docs_path = docs_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        private = path.startswith("/v1/") or path == "/console" or path.startswith("/console/")
        docs = self.docs_path is not None and path.startswith(self.docs_path)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if not (private and k.lower() == b"cache-control")
                ]
                names = {k.lower() for k, _ in headers}
                extra = [
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"content-security-policy", DOCS_CSP if docs else API_CSP),
                ]
                headers += [(k, v) for k, v in extra if k not in names]
                if private:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


# Threads for key checks (a Postgres read and a Redis script each), apart from the shared
# pool the routes run on: a flood of requests waits here, not in front of every route. More
# than the engine's connections (2 + 4 overflow) would only queue on the pool instead.
KEY_CHECK_THREADS = 8


class BodyLimit:
    """Every route's body limit, enforced while reading: a Content-Length over it is refused
    ``413 body_too_large`` before a byte of the body is read, and a chunked body is counted
    as it arrives and refused the moment it passes the limit. The app never buffers or
    parses more than the limit, whichever route, key or no key.

    ``POST /v1/turns`` may carry ``submit_limit`` bytes (CALLGATE_API_MAX_BODY_BYTES); every
    other route ``SMALL_BODY_BYTES`` (a console sign-in is one key; the rest take none), so
    no body JSON that FastAPI parses on the event loop is ever large.

    An answer sent before the body was whole (a 401, a route that reads none) says
    ``Connection: close``: the server hangs up after it rather than read the rest."""

    def __init__(self, app: ASGIApp, *, submit_limit: int) -> None:
        self.app = app
        self.submit_limit = submit_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        submit = scope["path"] == "/v1/turns" and scope["method"] == "POST"
        limit = self.submit_limit if submit else SMALL_BODY_BYTES
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and int(declared) > limit:  # h11 let only digits through
            await _too_large(limit)(scope, receive, send)
            return
        received = 0
        started = refused = False
        whole = not (int(declared or 0) or b"transfer-encoding" in headers)

        async def counting_receive() -> Message:
            nonlocal received, refused, whole
            message = await receive()
            if message["type"] == "http.request":
                whole = whole or not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > limit:
                    if not started:
                        refused = True
                        await _too_large(limit)(scope, receive, send)
                    # Stops the route reading; whatever it answers to this is not sent.
                    raise InputError(
                        f"the body is larger than {limit} bytes", code=ErrorCode.BODY_TOO_LARGE
                    )
            return message

        async def answering_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
                if not whole:
                    close = [(b"connection", b"close")]
                    message = {**message, "headers": [*message.get("headers", []), *close]}
            await send(message)

        await self.app(scope, counting_receive, answering_send)


def _too_large(limit: int) -> ASGIApp:
    # Connection: close, so the server stops reading the rest of the body and hangs up.
    return problems.problem(
        ErrorCode.BODY_TOO_LARGE,
        f"the body is larger than this route's {limit} bytes",
        headers={"Connection": "close"},
    )


def create_app(settings: Settings, api: ApiSettings) -> FastAPI:
    """The API and the console on ``settings``' Postgres, Redis and registry."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        producer = Producer.from_env(settings)
        # Long-polls' stream reads alone use this pool: the waits' bound keeps it from
        # running out (WaitSlots).
        stream_reader = transport.connect_async(
            producer.settings.require_redis(), max_connections=api.redis_pool
        )
        collector = AsyncProducer(producer, stream_reader)
        app.state.services = Services(
            producer=producer,
            collector=collector,
            limiter=RateLimiter(producer.redis, settings.queue, api.rate, api.burst),
            waits=WaitSlots(api.max_waits_per_key, api.wait_bound, api.tenant_wait_share),
            key_checks=anyio.CapacityLimiter(KEY_CHECK_THREADS),
            # /readyz's checks never queue behind requests: one thread of their own.
            readiness=anyio.CapacityLimiter(1),
            api=api,
        )
        try:
            yield
        finally:
            await collector.aclose()  # the stream reader, then the producer

    app = FastAPI(
        title="callgate",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs" if api.docs else None,
        redoc_url=None,
        # FastAPI's own telemetry would add a second server span recording the query string
        # (a tool query's text), and logs of validation failures quoting the values sent:
        # the access layer's span (callgate.observe.tracing.serving) is the one, and it
        # records ids, the route template and the status only.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    problems.install(app)
    app.include_router(routes.router)
    app.include_router(console.router)
    make_document = app.openapi

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = problems.tidy_openapi(make_document())
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]
    # Outside Starlette's ServerErrorMiddleware too, so an unexpected 500 carries them.
    build_stack = app.build_middleware_stack

    def stack() -> ASGIApp:
        limited = BodyLimit(build_stack(), submit_limit=api.max_body)
        return AccessLog(SecurityHeaders(limited, docs_path="/docs" if api.docs else None))

    app.build_middleware_stack = stack  # type: ignore[method-assign]
    return app
