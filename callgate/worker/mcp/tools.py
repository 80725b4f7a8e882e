"""An MCP server's tool as a callgate ``Tool``: classified from its annotations, run through
the whole gate, its response checked and normalised.

Classification (the configuration's ``tools`` entry overrides each hint):

- ``readOnlyHint: true`` → a read (runs in parallel with the turn's other reads);
- otherwise a write (ordered within its turn). MCP's own defaults apply to what a server
  leaves out: ``destructiveHint`` true, ``idempotentHint`` false;
- a destructive write asks for an approval bound to the call's intent (``approval``
  overrides); its impact names the server, the tool and the (redacted) arguments;
- ``idempotentHint: true`` lets a write be sent again after an attempt whose outcome is
  unknown (a dead server, a timeout). A write without it, whose server offers no status
  lookup (MCP has none), ends ``reconciliation_pending`` instead: never sent twice.

The arguments are the tool's ``inputSchema``: the gate checks them before anything is sent.
The handler mints a new JSON-RPC request id, traces it beside the provider's call id, sends
the call on the process's shared session, traces what came back, and hands the response to
``callgate.worker.mcp.results.normalise_result`` (response id check, JSON-RPC error versus
``isError``). ``structuredContent`` is checked against the ``outputSchema``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from callgate.core.errors import AdapterError, ErrorCode, ToolError
from callgate.core.types import Succeeded
from callgate.store import mcp_evidence
from callgate.store.db import Engine
from callgate.store.mcp_catalog import Definition, ServerInfo
from callgate.tools import redaction
from callgate.tools.gate import check_arguments
from callgate.tools.registry import (
    READ_ONLY,
    Downstream,
    ExecutionContext,
    Facts,
    Kind,
    Principal,
    SideEffect,
    Tool,
)
from callgate.worker.mcp.client import Connection, Exchange, Unavailable, new_request_id
from callgate.worker.mcp.config import ServerConfig, ToolOverride
from callgate.worker.mcp.results import normalise_result

log = logging.getLogger("callgate.mcp")

POLICY_VERSION = "mcp-1"
MAX_NAME_LENGTH = 200


def classify(definition: Definition, override: ToolOverride) -> dict[str, bool]:
    """The effective hints: the configuration's, else the server's, else MCP's defaults."""
    published = definition.annotations or {}

    def hint(configured: bool | None, key: str, default: bool) -> bool:
        if configured is not None:
            return configured
        value = published.get(key)
        return value if isinstance(value, bool) else default

    read_only = hint(override.read_only, "readOnlyHint", False)
    destructive = False if read_only else hint(override.destructive, "destructiveHint", True)
    idempotent = True if read_only else hint(override.idempotent, "idempotentHint", False)
    approval = override.approval if override.approval is not None else destructive
    return {
        "read_only": read_only,
        "destructive": destructive,
        "idempotent": idempotent,
        "approval": approval,
    }


def build(
    server: ServerConfig,
    definition: Definition,
    *,
    schema_version: str,
    info: ServerInfo,
    connection: Connection,
    engine: Engine | None,
) -> Tool | None:
    """The callgate tool for one listed MCP tool, or ``None`` when it cannot be offered (a
    name too long, an input schema that is not a JSON Schema object)."""
    name = server.tool_name(definition.tool)
    if len(name) > MAX_NAME_LENGTH:
        log.warning("MCP tool %r: its name is too long to offer", name)
        return None
    if definition.input_schema.get("type") != "object":
        log.warning("MCP tool %r: its inputSchema is not an object schema; not offered", name)
        return None
    try:
        check_arguments(definition.input_schema, {})
        if definition.output_schema is not None:
            check_arguments(definition.output_schema, {})
    except Exception as exc:
        log.warning("MCP tool %r: %s; not offered", name, exc)
        return None
    hints = classify(definition, server.tools.get(definition.tool, ToolOverride()))
    kind: Kind = "read" if hints["read_only"] else "write"
    effect = (
        READ_ONLY
        if hints["read_only"]
        else SideEffect(idempotent=hints["idempotent"], reversible=not hints["destructive"])
    )
    invoke = _Invocation(server, definition, name, kind, schema_version, info, connection, engine)

    async def run(args: dict[str, Any], ctx: ExecutionContext) -> dict[str, Any]:
        return await invoke(args, ctx)

    handler: Callable[..., Any] = run  # an async handler runs on the tool event loop

    return Tool(
        name=name,
        description=definition.description or f"{definition.tool} (MCP server {server.name})",
        arguments=definition.input_schema,
        kind=kind,
        handler=handler,
        version=info.version or "0",
        schema_version=schema_version,
        effect=effect,
        downstream=Downstream(),
        risk=_approval(server.name, definition.tool, hints) if hints["approval"] else None,
        policy_version=POLICY_VERSION,
    )


def _approval(server: str, tool: str, hints: Mapping[str, bool]) -> Any:
    def risk(args: Any, facts: Facts, principal: Principal) -> dict[str, Any]:
        return {
            "mcp_server": server,
            "mcp_tool": tool,
            "destructive": hints["destructive"],
            "idempotent": hints["idempotent"],
            "reversible": not hints["destructive"],
            "arguments": redaction.redact_value(dict(args)),
        }

    return risk


class _Invocation:
    """One MCP tool's handler: everything between the gate and the server."""

    def __init__(
        self,
        server: ServerConfig,
        definition: Definition,
        name: str,
        kind: str,
        schema_version: str,
        info: ServerInfo,
        connection: Connection,
        engine: Engine | None,
    ) -> None:
        self.server = server
        self.definition = definition
        self.name = name
        self.kind = kind
        self.schema_version = schema_version
        self.info = info
        self.connection = connection
        self.engine = engine

    async def __call__(self, args: dict[str, Any], ctx: ExecutionContext) -> dict[str, Any]:
        request_id = new_request_id()
        # The evidence of the request is its ids, names and versions, never its params: so
        # not the ``_meta`` trace context the client adds when it traces. That belongs to
        # this delivery's span (each redelivery has its own), which the reservation's event
        # already records; kept out, the evidence of a call is the same traced or not.
        call_ids = await self._trace(
            ctx,
            "mcp_request",
            {
                "mcp_server": self.server.name,
                "mcp_tool": self.definition.tool,
                "jsonrpc_id": request_id,
                "schema_version": self.schema_version,
                "server_version": self.info.version,
                "protocol_version": self.info.protocol_version,
            },
        )
        started = time.monotonic()
        try:
            exchange = await self.connection.call(
                self.definition.tool, args, request_id=request_id, timeout=self.server.timeout
            )
        except Unavailable as exc:
            await self._trace(
                ctx,
                "mcp_no_response",
                {"jsonrpc_id": request_id, "sent": exc.sent, "reason": exc.message},
            )
            # Not sent: the server cannot have acted on it, so even a write may be retried.
            raise ToolError(
                exc.message,
                code=ErrorCode.UPSTREAM_UNAVAILABLE,
                applied=False if not exc.sent else None,
            ) from None
        elapsed = round((time.monotonic() - started) * 1000, 1)
        await self._trace(ctx, "mcp_response", _evidence(exchange, elapsed))
        provider_call_id = call_ids[0] if call_ids else ctx.operation_id
        try:
            result = normalise_result(
                exchange.response,
                provider_call_id=provider_call_id,
                tool_name=self.name,
                request_id=request_id,
            )
        except AdapterError as err:
            if self.kind == "write":
                # The server may have applied the write; its answer cannot tell us. Only a
                # status lookup or a repeat-safe write may go on from here.
                raise ToolError(
                    f"MCP server {self.server.name!r} gave no usable answer to a write "
                    f"({err.code}): {err.message}",
                    code=ErrorCode.UPSTREAM_UNAVAILABLE,
                ) from None
            raise ToolError(err.message, code=err.code) from None
        if not isinstance(result, Succeeded):
            error = result.error
            details = [d.model_dump(exclude_none=True) for d in error.details]
            raise ToolError(
                f"MCP tool {self.name} failed ({error.code})",
                code=ErrorCode(error.code),
                details=details,
                retry_after_ms=error.retry_after_ms,
            )
        return self._checked_output(result.data)

    def _checked_output(self, data: dict[str, Any]) -> dict[str, Any]:
        schema = self.definition.output_schema
        if schema is None:
            return data
        structured = data.get("structuredContent")
        details = (
            check_arguments(schema, structured)
            if structured is not None
            else [{"path": "", "code": "missing", "expected": "structuredContent"}]
        )
        if not details:
            return data
        if self.kind == "read":
            raise ToolError(
                f"MCP tool {self.name}'s structuredContent does not match its outputSchema",
                code=ErrorCode.MCP_INVALID_OUTPUT,
                details=details,
            )
        # A write that the server reports done did apply: the call succeeds, without the
        # structured part that does not match what the server promised.
        log.warning("MCP tool %s: structuredContent withheld (not its outputSchema)", self.name)
        return {k: v for k, v in data.items() if k != "structuredContent"} | {
            "structuredContentWithheld": True
        }

    async def _trace(self, ctx: ExecutionContext, event: str, detail: dict[str, Any]) -> list[str]:
        if self.engine is None:
            return []
        engine = self.engine
        try:
            return await asyncio.to_thread(
                mcp_evidence.record,
                engine,
                operation_id=ctx.operation_id,
                generation=ctx.fencing_token,
                event=event,
                detail=redaction.redact_value(detail, names=False),
            )
        except Exception as exc:  # evidence is best effort; the call's own trace stands
            log.warning("MCP evidence for %s not written: %s", self.name, exc)
            return []


def _evidence(exchange: Exchange, elapsed_ms: float) -> dict[str, Any]:
    """The raw protocol facts of one response, for the trace: ids and codes, never content."""
    response = exchange.response
    detail: dict[str, Any] = {
        "jsonrpc_id": exchange.request_id,
        "response_id": response.get("id"),
        "id_matches": response.get("id") == exchange.request_id and not exchange.stray,
        "duration_ms": elapsed_ms,
    }
    error = response.get("error")
    if isinstance(error, Mapping):
        detail["outcome"] = "jsonrpc_error"
        detail["jsonrpc_error_code"] = error.get("code")
    else:
        result = response.get("result")
        is_error = isinstance(result, Mapping) and result.get("isError") is True
        detail["outcome"] = "tool_error" if is_error else "result"
        if is_error and isinstance(result, Mapping):
            structured = result.get("structuredContent")
            if isinstance(structured, Mapping) and isinstance(structured.get("errorCode"), str):
                detail["server_error_code"] = structured["errorCode"]
    return detail
