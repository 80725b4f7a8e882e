"""``callgate mcp-gateway --http``: the principal of each request's API key.

Over stdio only the host that started the gateway can talk to it; over HTTP anything that
can open a socket can, so nothing but a key says who asks. Imported only when serving HTTP
(the MCP SDK is an optional extra).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from callgate.core.errors import AccessError, CallgateError, ErrorCode
from callgate.core.types import CallContext
from callgate.ops.http.auth import RateLimiter, bearer_key
from callgate.store import api_keys
from callgate.store.api_keys import KeyHolder

log = logging.getLogger("callgate.mcp.gateway")

UNAUTHENTICATED = -32001  # implementation-defined server error: no key on the request


class KeyUser(AuthenticatedUser):
    """The request's key, as the MCP SDK's transports see a user: a session is bound to the
    key that opened it (the SDK answers another key's use of it as an unknown session).
    The token field holds the key id: the secret is never kept past the check."""

    def __init__(self, principal: KeyHolder) -> None:
        super().__init__(
            AccessToken(
                token=principal.key_id,
                client_id=principal.key_id,
                scopes=[],
                subject=f"{principal.tenant_id}/{principal.user_id}",
            )
        )
        self.principal = principal

    def context(self) -> CallContext:
        p = self.principal
        return CallContext(
            request_id=f"mcp-{uuid.uuid4().hex}",
            tenant_id=p.tenant_id,
            user_id=p.user_id,
            roles=p.roles,
        )


ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class KeyAuth:
    """Every HTTP request is authenticated, as ``callgate api`` does it, before the MCP
    transport reads a byte of it: ``Authorization: Bearer KEY``, the key's row read (a
    revoked key is refused at once), one token of its rate limit. Refusals are RFC 9457
    problems with callgate's code and never repeat the key."""

    def __init__(self, app: ASGIApp, engine: Any, limiter: RateLimiter) -> None:
        self.app = app
        self.engine = engine
        self.limiter = limiter
        # Key checks draw on their own threads' budget, never queueing behind tools/calls
        # that wait for their results on the shared pool.
        self._threads: Any = None

    def _principal(self, authorization: str | None) -> KeyHolder:
        principal = api_keys.authenticate(self.engine, bearer_key(authorization))
        self.limiter.take(principal)
        return principal

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        import anyio

        if self._threads is None:
            self._threads = anyio.CapacityLimiter(8)
        authorization = next(
            (v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"authorization"),
            None,
        )
        try:
            principal = await anyio.to_thread.run_sync(
                self._principal, authorization, limiter=self._threads
            )
        except CallgateError as exc:
            log.info("mcp-gateway: refused a request: %s", exc.code)
            await _problem(send, exc)
            return
        scope["user"] = KeyUser(principal)
        await self.app(scope, receive, send)


async def _problem(send: Callable[[Any], Awaitable[None]], exc: CallgateError) -> None:
    status = {
        ErrorCode.UNAUTHENTICATED: 401,
        ErrorCode.RATE_LIMITED: 429,
        ErrorCode.DATABASE_UNAVAILABLE: 503,
        ErrorCode.REDIS_UNAVAILABLE: 503,
    }.get(exc.code, 400)
    body = json.dumps(
        {
            "type": f"urn:callgate:error:{exc.code.value}",
            "title": exc.code.value.replace("_", " "),
            "status": status,
            "detail": exc.message,
            "code": exc.code.value,
        }
    ).encode()
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if exc.code == ErrorCode.UNAUTHENTICATED:
        headers.append((b"www-authenticate", b'Bearer realm="callgate"'))
    if isinstance(exc, AccessError) and exc.retry_after is not None:
        headers.append((b"retry-after", str(max(1, int(exc.retry_after + 0.999))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
