"""The chaos runner's tool registry: the demo tools, counted, plus one unguarded write.

Workers of a chaos run load it with ``CALLGATE_TOOLS=callgate.ops.lab.chaos.tools:chaos_registry``.

- Every handler first records its invocation in ``chaos.invocations`` (tool, operation,
  idempotency key, fencing token, the worker's pid), in the downstream database and in its
  own commit. The runner counts handler invocations from these rows, and finds the pid of the
  worker running a call there, so it can kill exactly that process.
- ``chaos.outages`` makes a tool's downstream answer ``upstream_unavailable`` until a moment,
  or to its next N requests (the runner sets it): the request is refused before anything
  applies (``applied=False``).
- ``charge_unkeyed``: a write whose downstream takes no idempotency key, no fencing token
  and has no status lookup. After a crash gap it must end ``reconciliation_pending`` and
  never be sent again. Its charges are counted in ``downstream.requests`` and
  ``downstream.side_effects`` like the demo providers' writes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, text

from callgate.core.errors import ErrorCode, ToolError
from callgate.ops.lab.demo.tools import ALLOWLIST, DemoServices, demo_registry
from callgate.tools.registry import (
    Downstream,
    ExecutionContext,
    Handler,
    Registry,
    SideEffect,
    Tool,
)

CHAOS_TOOLS = "callgate.ops.lab.chaos.tools:chaos_registry"
UNKEYED = "charge_unkeyed"

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS chaos;
CREATE TABLE IF NOT EXISTS chaos.invocations (
    id              bigserial PRIMARY KEY,
    tool_name       text NOT NULL,
    operation_id    text NOT NULL,
    idempotency_key text NOT NULL,
    fencing_token   bigint NOT NULL,
    pid             integer NOT NULL,
    refused         boolean NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS invocations_operation ON chaos.invocations (operation_id);
CREATE TABLE IF NOT EXISTS chaos.outages (
    tool_name text PRIMARY KEY,
    until     timestamptz,
    remaining integer NOT NULL DEFAULT 0
)
"""

# One round trip: the invocation is recorded, and whether the tool's downstream refuses it
# (it is down until a moment, or refuses a number of requests more).
RECORD_SQL = """
WITH hit AS (
    UPDATE chaos.outages SET remaining = remaining - 1
     WHERE tool_name = :tool AND remaining > 0
    RETURNING 1
)
INSERT INTO chaos.invocations
       (tool_name, operation_id, idempotency_key, fencing_token, pid, refused)
SELECT :tool, :op, :key, :fence, :pid,
       EXISTS (SELECT 1 FROM hit)
       OR coalesce((SELECT until > clock_timestamp() FROM chaos.outages
                     WHERE tool_name = :tool), false)
RETURNING refused
"""


def install(engine: Engine) -> None:
    """Create the ``chaos`` schema (safe to repeat) next to the demo downstream."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('callgate.chaos'))"))
        for statement in SCHEMA_SQL.split(";"):
            if statement.strip():
                conn.execute(text(statement))


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(gt=0, description="Amount in minor units")
    reference: str = Field(min_length=1, max_length=64, description="Caller's reference")


def _counted(svc: DemoServices, tool: Tool) -> Handler:
    inner = tool.handler

    def handler(args: Any, ctx: ExecutionContext) -> Any:
        with svc.engine.begin() as conn:
            refused = conn.execute(
                text(RECORD_SQL),
                {
                    "tool": tool.name,
                    "op": ctx.operation_id,
                    "key": ctx.idempotency_key,
                    "fence": ctx.fencing_token,
                    "pid": os.getpid(),
                },
            ).scalar_one()
        if refused:
            raise ToolError(
                "the downstream is unavailable",
                code=ErrorCode.UPSTREAM_UNAVAILABLE,
                applied=False,
            )
        return inner(args, ctx)

    return handler


def chaos_registry(services: DemoServices | None = None) -> Registry:
    """The demo tools and ``charge_unkeyed``, every handler counted in ``chaos.invocations``."""
    svc = services or DemoServices()

    def charge_unkeyed(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause(UNKEYED, 0)
        params = {"s": "unkeyed", "k": ctx.idempotency_key, "f": ctx.fencing_token}
        with svc.engine.begin() as conn:
            # The gateway receives no key and no fence; the key is written here only so the
            # runner can attribute the charge to its operation.
            conn.execute(
                text(
                    "INSERT INTO downstream.requests (service, idempotency_key, fencing_token)"
                    " VALUES (:s, :k, :f)"
                ),
                params,
            )
            conn.execute(
                text(
                    "INSERT INTO downstream.side_effects"
                    " (service, idempotency_key, resource_id, action, fencing_token)"
                    " VALUES (:s, :k, 'card-on-file', 'charge', :f)"
                ),
                params,
            )
        svc.pause(UNKEYED, 1)
        return {"charged": args.amount, "reference": args.reference}

    unkeyed = Tool(
        UNKEYED,
        "Charge the card on file through a legacy gateway (no idempotency key, no fencing, "
        "no status lookup). Not for refunds.",
        ChargeArgs,
        "write",
        charge_unkeyed,
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(),
    )
    base = demo_registry(svc)
    tools = [
        dataclasses.replace(t, handler=_counted(svc, t)) for t in [*base.tools.values(), unkeyed]
    ]
    allowlist = {role: list(names) for role, names in ALLOWLIST.items()}
    allowlist["support"].append(UNKEYED)
    return Registry.of(tools, allowlist)
