"""``callgate mcp-gateway``: callgate as an MCP server, for one principal.

Any MCP host (a desktop assistant, an IDE agent) connects to the gateway as it would to any
server, over stdio or, with ``--http PORT``, streamable HTTP. The gateway serves the tools of
``CALLGATE_TOOLS`` and of the servers ``CALLGATE_MCP_CONFIG`` names, as the principal of
``--context`` may use them:

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

import json
import logging
import threading
import time
import uuid
from typing import Any, TextIO

import click

from callgate.store import approvals, values
from callgate.store.errors import CallgateError, ConfigurationError, ErrorCode, InputError
from callgate.store.types import TRUST_LABEL, CallContext

log = logging.getLogger("callgate.mcp.gateway")

UNKNOWN_TOOL = -32602  # JSON-RPC invalid params: the principal has no such tool
POLL_SECONDS = 0.5
SERVER_NAME = "callgate"


class Gateway:
    """The gateway's decisions, apart from the MCP transport (blocking: call it on a thread)."""

    def __init__(self, producer: Any, context: CallContext, *, wait: float) -> None:
        self.producer = producer
        self.context = context
        self.wait = wait
        # (tool, canonical arguments) → the operation a parked or unfinished call started.
        self._open: dict[str, str] = {}
        self._lock = threading.Lock()

    def tool_list(self) -> list[dict[str, Any]]:
        """The principal's tools, as MCP tool definitions."""
        registry = self.producer.registry
        out = []
        for definition in registry.definitions_for(self.context.roles):
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

    def allows(self, name: str) -> bool:
        registry = self.producer.registry
        return name in registry.tools and name in registry.allowed_for(self.context.roles)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run one ``tools/call`` through callgate; returns the MCP ``CallToolResult``.

        The caller has checked ``allows(name)``.
        """
        key = name + "\x00" + json.dumps(arguments, sort_keys=True, separators=(",", ":"))
        with self._lock:
            operation = self._open.get(key)
        call_id = f"mcp-{uuid.uuid4().hex[:16]}"
        try:
            turn = self.producer.submit(
                [{"call_id": call_id, "tool_name": name, "arguments": arguments}],
                self.context,
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
                return self._parked(approval_id, operation_id)
            if remaining <= 0:
                with self._lock:
                    self._open[key] = operation_id
                return _failure(
                    {"code": ErrorCode.OPERATION_IN_PROGRESS.value},
                    status="pending",
                    operation_id=operation_id,
                )

    def _parked(self, approval_id: str, operation_id: str) -> dict[str, Any]:
        impact: Any = None
        try:
            request = approvals.show(
                self.producer.engine, approval_id, tenant=self.context.tenant_id
            )
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


def serve(gateway: Gateway, *, port: int | None, host: str) -> None:
    """Serve the gateway over stdio, or streamable HTTP on ``host:port``."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = await anyio.to_thread.run_sync(gateway.tool_list)
        return types.ListToolsResult.model_validate({"tools": tools})

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if not gateway.allows(params.name):
            raise MCPError(code=UNKNOWN_TOOL, message=f"Unknown tool: {params.name}")
        answer = await anyio.to_thread.run_sync(
            gateway.call, params.name, dict(params.arguments or {})
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
    import uvicorn

    uvicorn.run(server.streamable_http_app(), host=host, port=port, log_level="warning")


@click.command("mcp-gateway")
@click.option(
    "--context",
    "context_file",
    type=click.File("r"),
    required=True,
    help="The principal's context, JSON {request_id, tenant_id, user_id, roles}.",
)
@click.option(
    "--http",
    "port",
    type=click.IntRange(1, 65535),
    default=None,
    envvar="CALLGATE_MCP_GATEWAY_PORT",
    help="Serve streamable HTTP on this port (path /mcp) instead of stdio "
    "(env CALLGATE_MCP_GATEWAY_PORT).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="CALLGATE_MCP_GATEWAY_HOST",
    help="Address to listen on with --http (env CALLGATE_MCP_GATEWAY_HOST).",
)
@click.option(
    "--wait",
    type=click.FloatRange(0, 3600),
    default=30.0,
    show_default=True,
    envvar="CALLGATE_MCP_GATEWAY_WAIT",
    help="Seconds a tools/call waits for its result before answering that it is still "
    "running (env CALLGATE_MCP_GATEWAY_WAIT).",
)
def mcp_gateway_cmd(context_file: TextIO, port: int | None, host: str, wait: float) -> None:
    """Serve callgate as an MCP server for one principal (stdio, or --http PORT).

    tools/list shows the principal's allowlist; each tools/call is recorded, queued, run by
    the workers and answered from its terminal result. Needs CALLGATE_DATABASE_URL,
    CALLGATE_REDIS_URL, CALLGATE_TOOLS (and CALLGATE_MCP_CONFIG for MCP servers' tools),
    and workers running.
    """
    from callgate.producer import Producer

    context = _context(context_file)
    if not context.roles:
        raise ConfigurationError("the context names no roles: the gateway would offer no tool")
    producer = Producer.from_env()
    try:
        serve(Gateway(producer, context, wait=wait), port=port, host=host)
    finally:
        producer.close()
