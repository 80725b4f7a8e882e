"""``callgate mcp-gateway``: callgate as an MCP server.

Any MCP host (a desktop assistant, an IDE agent) connects to the gateway as it would to any
server, over stdio or, with ``--http PORT``, streamable HTTP. The gateway serves the tools of
``CALLGATE_TOOLS`` and of the servers ``CALLGATE_MCP_CONFIG`` names, as the principal may use
them. Who the principal is depends on the transport:

- stdio: the ``--context`` file. Only the host that started the process can talk to it, so
  the file is as trusted as the host's own configuration.
- HTTP: the API key of each request (``Authorization: Bearer cgk.…``, ``callgate keys
  create``), read as ``callgate api`` reads it: the key's row on every request (a revoked key
  is refused at once), one token of its rate limit, and its tenant, user and roles as the
  principal. Anything on the machine (or the network) can open a socket, so nothing but a
  key says who asks; a request without a valid one is 401 before any MCP message is read,
  and a session opened with one key cannot be used with another. The DNS-rebinding filter
  (Host and Origin) takes ``--allowed-hosts``/``--allowed-origins``.

For that principal:

- ``tools/list`` shows exactly that principal's allowlist;
- each ``tools/call`` is recorded as a turn, queued, run by the workers through the whole
  gate and answered from the call's terminal result (``structuredContent`` is callgate's
  result: the safe result with its trust label, or the failure with its stable code);
- a refused or failed call answers ``isError: true`` with its code; a tool the principal
  does not have (unknown, or not allowed) is JSON-RPC ``-32602``;
- a call that waits for an approval answers ``isError: true`` with the approval id and the
  impact the server computed; the same call made again after the decision continues the
  same operation (its result, or its refusal), as does a call still running when
  ``--wait`` ran out.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
import uuid
from typing import Any, TextIO

import click

from callgate.core import values
from callgate.core.errors import CallgateError, ConfigurationError, ErrorCode, InputError
from callgate.core.settings import describe
from callgate.core.types import TRUST_LABEL, CallContext
from callgate.ops.flags import setting_option
from callgate.store import api_keys, approvals

log = logging.getLogger("callgate.mcp.gateway")

UNKNOWN_TOOL = -32602  # JSON-RPC invalid params: the principal has no such tool
POLL_SECONDS = 0.5
SERVER_NAME = "callgate"
# The DNS-rebinding filter's defaults: clients on this machine, on any port.
# The loopback defaults, as the settings declare them.
LOOPBACK_HOSTS = tuple(describe("CALLGATE_MCP_GATEWAY_ALLOWED_HOSTS").default.split(","))
LOOPBACK_ORIGINS = tuple(describe("CALLGATE_MCP_GATEWAY_ALLOWED_ORIGINS").default.split(","))


class Gateway:
    """The gateway's decisions, apart from the MCP transport (blocking: call it on a thread).

    Every decision is for the ``context`` it is given: the ``--context`` file's on stdio, the
    request's key's over HTTP.
    """

    def __init__(self, producer: Any, *, wait: float) -> None:
        self.producer = producer
        self.wait = wait
        # (tenant, user, tool, canonical arguments) → the operation a parked or unfinished
        # call started. The principal is part of the key: one principal's call never
        # continues another's operation.
        self._open: dict[str, str] = {}
        self._lock = threading.Lock()

    def tool_list(self, context: CallContext) -> list[dict[str, Any]]:
        """The principal's tools, as MCP tool definitions."""
        registry = self.producer.registry
        out = []
        for definition in registry.definitions_for(context.roles):
            tool = registry.tools[definition["name"]]
            read = tool.kind == "read"
            out.append(
                {
                    "name": definition["name"],
                    "description": definition["description"],
                    "inputSchema": definition["parameters"],
                    "annotations": {
                        "readOnlyHint": read,
                        "destructiveHint": False if read else not tool.effect.reversible,
                        "idempotentHint": True if read else tool.effect.idempotent,
                    },
                }
            )
        return out

    def allows(self, context: CallContext, name: str) -> bool:
        registry = self.producer.registry
        return name in registry.tools and name in registry.allowed_for(context.roles)

    def call(self, context: CallContext, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run one ``tools/call`` through callgate; returns the MCP ``CallToolResult``.

        The caller has checked ``allows(context, name)``.
        """
        key = json.dumps(
            [context.tenant_id, context.user_id, name, arguments],
            sort_keys=True,
            separators=(",", ":"),
        )
        with self._lock:
            operation = self._open.get(key)
        call_id = f"mcp-{uuid.uuid4().hex[:16]}"
        try:
            turn = self.producer.submit(
                [{"call_id": call_id, "tool_name": name, "arguments": arguments}],
                context,
                operation_ids={call_id: operation} if operation else None,
            )
        except CallgateError as exc:  # refused before anything was recorded
            return _failure({"code": exc.code.value, "details": _safe(exc.details)})
        operation_id = turn.calls[0].operation_id
        deadline = time.monotonic() + self.wait
        while True:
            remaining = deadline - time.monotonic()
            collected = self.producer.collect(
                turn.turn_id, timeout=max(0.0, min(POLL_SECONDS, remaining))
            )
            if collected.complete:
                with self._lock:
                    self._open.pop(key, None)
                return _answer(collected.results[0].model_dump(mode="json", exclude_none=True))
            approval_id = collected.awaiting_approval.get(call_id)
            if approval_id is not None:
                with self._lock:
                    self._open[key] = operation_id
                return self._parked(context, approval_id, operation_id)
            if remaining <= 0:
                with self._lock:
                    self._open[key] = operation_id
                return _failure(
                    {"code": ErrorCode.OPERATION_IN_PROGRESS.value},
                    status="pending",
                    operation_id=operation_id,
                )

    def _parked(self, context: CallContext, approval_id: str, operation_id: str) -> dict[str, Any]:
        impact: Any = None
        try:
            request = approvals.show(self.producer.engine, approval_id, tenant=context.tenant_id)
            impact = request.get("impact")
        except CallgateError as exc:
            log.warning("approval %s: %s", approval_id, exc.message)
        return _failure(
            {"code": ErrorCode.APPROVAL_REQUIRED.value},
            status="awaiting_approval",
            approval_id=str(approval_id),
            impact=impact,
            operation_id=operation_id,
        )


def _answer(result: dict[str, Any]) -> dict[str, Any]:
    if result["status"] == "succeeded":
        data = result["data"]
        return {
            "content": [{"type": "text", "text": json.dumps(data, ensure_ascii=False)}],
            "structuredContent": data,
            "isError": False,
        }
    return _failure(result["error"], status=result["status"])


def _failure(
    error: dict[str, Any], *, status: str = "failed_terminal", **extra: Any
) -> dict[str, Any]:
    body = {"status": status, "error": error, **extra, "trust": TRUST_LABEL}
    return {
        "content": [{"type": "text", "text": json.dumps(body, ensure_ascii=False, default=str)}],
        "structuredContent": body,
        "isError": True,
    }


def _safe(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keep = ("code", "path", "expected", "message")
    return [{k: d[k] for k in keep if k in d} for d in details]


def _context(stream: TextIO) -> CallContext:
    try:
        raw = values.loads(stream.read(), check_values=False)
    except Exception as exc:
        raise InputError(f"context file is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError("context must be a JSON object {request_id, tenant_id, user_id, roles}")
    try:
        return CallContext.model_validate(raw)
    except Exception as exc:
        raise InputError(
            f"context file is not a valid context: {str(exc).splitlines()[0]}"
        ) from None


# --- HTTP: the principal of each request's API key ------------------------------------------


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _listed(raw: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (raw or "").split(",") if v.strip())


def serve(
    gateway: Gateway,
    *,
    context: CallContext | None,
    port: int | None,
    host: str,
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS,
    allowed_origins: tuple[str, ...] = LOOPBACK_ORIGINS,
) -> None:
    """Serve the gateway over stdio for ``context``, or streamable HTTP on ``host:port`` for
    each request's key."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError

    def principal(ctx: Any) -> CallContext:
        if context is not None:
            return context
        from callgate.ops.mcp_gateway_auth import UNAUTHENTICATED, KeyUser

        request = getattr(ctx, "request", None)
        user = request.scope.get("user") if request is not None else None
        if not isinstance(user, KeyUser):  # KeyAuth lets no request through without one
            raise MCPError(code=UNAUTHENTICATED, message="no API key on this request")
        return user.context()

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await anyio.to_thread.run_sync(gateway.tool_list, principal(ctx))
        return types.ListToolsResult.model_validate({"tools": tools})

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        who = principal(ctx)
        if not gateway.allows(who, params.name):
            raise MCPError(code=UNKNOWN_TOOL, message=f"Unknown tool: {params.name}")
        answer = await anyio.to_thread.run_sync(
            gateway.call, who, params.name, dict(params.arguments or {})
        )
        return types.CallToolResult.model_validate(answer)

    server: Server[Any] = Server(
        SERVER_NAME, version="1", on_list_tools=list_tools, on_call_tool=call_tool
    )
    if port is None:

        async def run_stdio() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(run_stdio)
        return
    from mcp.server.transport_security import TransportSecuritySettings

    from callgate.ops import http_server
    from callgate.ops.http.auth import RateLimiter
    from callgate.ops.http.settings import ApiSettings
    from callgate.ops.mcp_gateway_auth import KeyAuth

    api = ApiSettings.from_env()
    app = server.streamable_http_app(
        host=host,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=list(allowed_hosts),
            allowed_origins=list(allowed_origins),
        ),
    )
    limiter = RateLimiter(
        gateway.producer.redis, gateway.producer.settings.queue, api.rate, api.burst
    )
    http_server.run(
        KeyAuth(app, gateway.producer.engine, limiter),
        host=host,
        port=port,
        header_timeout=api.header_timeout,
        body_timeout=api.body_timeout,
        keep_alive=api.keep_alive,
    )


@click.command("mcp-gateway")
@click.option(
    "--context",
    "context_file",
    type=click.File("r"),
    default=None,
    help="stdio only: the principal's context, JSON {request_id, tenant_id, user_id, roles}. "
    "Over --http each request's API key names its principal instead.",
)
@setting_option(
    "--http",
    "port",
    type=click.IntRange(1, 65535),
    variable="CALLGATE_MCP_GATEWAY_PORT",
    help="Serve streamable HTTP on this port (path /mcp) instead of stdio; every request "
    "needs Authorization: Bearer KEY (callgate keys create).",
)
@setting_option(
    "--host",
    variable="CALLGATE_MCP_GATEWAY_HOST",
    help="Address to listen on with --http.",
)
@setting_option(
    "--allowed-hosts",
    variable="CALLGATE_MCP_GATEWAY_ALLOWED_HOSTS",
    help="With --http: comma-separated Host header values the DNS-rebinding filter accepts "
    "(host:port, or host:* for any port); any other Host is 421. Needed with a --host "
    "that is not loopback.",
)
@setting_option(
    "--allowed-origins",
    variable="CALLGATE_MCP_GATEWAY_ALLOWED_ORIGINS",
    help="With --http: comma-separated Origin values accepted from browsers (scheme://host:port "
    "or :*); a request without Origin is not a browser's and passes.",
)
@setting_option(
    "--wait",
    type=click.FloatRange(0, 3600),
    variable="CALLGATE_MCP_GATEWAY_WAIT",
    help="Seconds a tools/call waits for its result before answering that it is still running.",
)
def mcp_gateway_cmd(
    context_file: TextIO | None,
    port: int | None,
    host: str,
    allowed_hosts: str,
    allowed_origins: str,
    wait: float,
) -> None:
    """Serve callgate as an MCP server: on stdio for the --context principal, or over
    --http PORT for the principal of each request's API key.

    tools/list shows the principal's allowlist; each tools/call is recorded, queued, run by
    the workers and answered from its terminal result. Needs CALLGATE_DATABASE_URL,
    CALLGATE_REDIS_URL, CALLGATE_TOOLS (and CALLGATE_MCP_CONFIG for MCP servers' tools),
    and workers running; over HTTP, the migrations applied and API keys (callgate keys
    create).
    """
    from callgate.producer import Producer

    context: CallContext | None = None
    if port is None:
        if context_file is None:
            raise click.UsageError("on stdio the gateway needs --context (or serve --http PORT)")
        context = _context(context_file)
        if not context.roles:
            raise ConfigurationError("the context names no roles: the gateway would offer no tool")
    else:
        if context_file is not None:
            # Over HTTP anyone who can reach the port would act as the file's principal.
            raise click.UsageError(
                "--context is for stdio: over --http each request's API key names its "
                "principal (callgate keys create)"
            )
        hosts, origins = _listed(allowed_hosts), _listed(allowed_origins)
        if not hosts:
            raise ConfigurationError("--allowed-hosts is empty: every request would be refused")
        if not _loopback(host) and set(hosts) <= set(LOOPBACK_HOSTS):
            raise ConfigurationError(
                f"--host {host} listens beyond this machine, but only loopback Host headers "
                "are allowed: name the host:port clients use with --allowed-hosts "
                "(CALLGATE_MCP_GATEWAY_ALLOWED_HOSTS)"
            )
    producer = Producer.from_env()
    try:
        if port is not None:
            active = api_keys.active_keys(producer.engine)  # refuses when not migrated
            if not active:
                log.warning("mcp-gateway: no API key exists yet; callgate keys create")
            serve(
                Gateway(producer, wait=wait),
                context=None,
                port=port,
                host=host,
                allowed_hosts=hosts,
                allowed_origins=origins,
            )
        else:
            serve(Gateway(producer, wait=wait), context=context, port=None, host=host)
    finally:
        producer.close()
