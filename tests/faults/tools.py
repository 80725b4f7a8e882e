"""Tools for the fault sweep whose handlers record every run and every effect in the
downstream's own tables (schema ``faults``), so a test counts effects, never trusts a flag.

- ``fault_read(n)``: a read; records its run.
- ``fault_keyed(note, hold_seconds)``: a write whose downstream honours idempotency keys (one
  effect per key; a repeat is a replay).
- ``fault_unkeyed(note, hold_seconds, needs_approval, doubt)``: a write whose downstream
  takes no key: every run that reaches it is a new effect. Nothing but callgate stands
  between a duplicate delivery and a second effect. ``needs_approval`` parks it for a
  person's approval; ``doubt`` makes the handler fail after its effect, so the call ends
  ``reconciliation_pending``.

The handlers connect to ``CALLGATE_DOWNSTREAM_DATABASE_URL`` (else the gate's database) as
application ``faults-downstream``, so a proxy can fault the downstream write itself.
Workers load it with ``CALLGATE_TOOLS=tests.faults.tools:registry``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field

from callgate.core.errors import ErrorCode, ToolError
from callgate.store.db import libpq_url
from callgate.tools.registry import (
    READ_ONLY,
    Downstream,
    ExecutionContext,
    Registry,
    SideEffect,
    Tool,
)

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS faults;
CREATE TABLE IF NOT EXISTS faults.runs (
    id bigserial PRIMARY KEY, tool text NOT NULL, operation_id text NOT NULL,
    note text NOT NULL, fence bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS faults.effects (
    id bigserial PRIMARY KEY, tool text NOT NULL, operation_id text NOT NULL,
    idempotency_key text, note text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX IF NOT EXISTS effects_by_key ON faults.effects (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""

TOOLS = ("fault_read", "fault_keyed", "fault_unkeyed")
WRITE_TOOLS = ("fault_keyed", "fault_unkeyed")


def install(database_url: str) -> None:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(SCHEMA_SQL)


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class WriteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str = Field(max_length=200)
    # Keeps the handler running (after its effect) so the lease is renewed meanwhile.
    hold_seconds: float = Field(default=0.0, ge=0, le=30)
    # The risk policy asks a person to approve it first (the approve cells).
    needs_approval: bool = False
    # After its effect, the handler fails without saying whether the write applied: an
    # unkeyed write then ends ``reconciliation_pending`` (the reconcile cells).
    doubt: bool = False


def _downstream() -> psycopg.Connection[Any]:
    """A connection to the downstream. A failure to connect is reported as what it is: the
    downstream was not reached, so this attempt applied nothing (what a user's handler would
    say; without it callgate must assume an unkeyed write may have applied)."""
    url = os.environ.get("CALLGATE_DOWNSTREAM_DATABASE_URL") or os.environ["CALLGATE_DATABASE_URL"]
    try:
        return psycopg.connect(
            libpq_url(url),
            autocommit=True,
            application_name="faults-downstream",
            connect_timeout=5,
        )
    except psycopg.OperationalError:
        raise ToolError(
            "the downstream is unreachable", code=ErrorCode.UPSTREAM_UNAVAILABLE, applied=False
        ) from None


def _run(conn: psycopg.Connection[Any], tool: str, ctx: ExecutionContext, note: str) -> None:
    conn.execute(
        "INSERT INTO faults.runs (tool, operation_id, note, fence) VALUES (%s, %s, %s, %s)",
        (tool, ctx.operation_id, note, ctx.fencing_token),
    )


def fault_read(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
    with _downstream() as conn:
        _run(conn, "fault_read", ctx, str(args.n))
    return {"n": args.n}


def fault_keyed(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
    with _downstream() as conn:
        _run(conn, "fault_keyed", ctx, args.note)
        row = conn.execute(
            "INSERT INTO faults.effects (tool, operation_id, idempotency_key, note)"
            " VALUES ('fault_keyed', %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
            (ctx.operation_id, ctx.idempotency_key, args.note),
        ).fetchone()
    ctx.report_effect(applied=row is not None)
    time.sleep(args.hold_seconds)
    return {"note": args.note, "replayed": row is None}


def fault_unkeyed(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
    with _downstream() as conn:
        _run(conn, "fault_unkeyed", ctx, args.note)
        conn.execute(
            "INSERT INTO faults.effects (tool, operation_id, note)"
            " VALUES ('fault_unkeyed', %s, %s)",
            (ctx.operation_id, args.note),
        )
    if args.doubt:
        raise RuntimeError("the downstream's answer could not be read")
    ctx.report_effect(applied=True)
    time.sleep(args.hold_seconds)
    return {"note": args.note}


def _risk(args: Any, facts: Any, principal: Any) -> dict[str, Any] | None:
    return {"action": "fault_unkeyed", "note": args.note} if args.needs_approval else None


IRREVERSIBLE = SideEffect(idempotent=False, reversible=False)


def registry() -> Registry:
    tools = [
        Tool("fault_read", "A read that records its run.", ReadArgs, "read", fault_read,
             effect=READ_ONLY),
        Tool("fault_keyed", "A write; its downstream honours idempotency keys.", WriteArgs,
             "write", fault_keyed, effect=IRREVERSIBLE,
             downstream=Downstream(idempotency_keys=True)),
        Tool("fault_unkeyed", "A write; its downstream takes no idempotency key.", WriteArgs,
             "write", fault_unkeyed, effect=IRREVERSIBLE, risk=_risk),
    ]  # fmt: skip
    return Registry.of(tools, {"support": TOOLS})
