"""A registry for tests: the demo tools plus tools whose downstreams offer less.

- ``charge_legacy``: irreversible, not idempotent; its downstream takes no idempotency key,
  no fencing token and has no status lookup (the last row of the takeover table). With
  ``CALLGATE_TEST_LEGACY_RESPONSE_TIMEOUT=1`` the charge commits and then the response times
  out for real (a statement timeout on the downstream's reply), as a client timeout would;
  with ``CALLGATE_TEST_LEGACY_RECEIPT=1`` it fetches a receipt after the charge, which fails
  with the driver's own exception if the gateway connection was cut.
- ``charge_fenced``: the same, but its downstream rejects a smaller fencing token than one it
  has seen for the key. Fencing alone cannot tell that an older generation already applied.
- ``charge_lookup``: like ``charge_legacy``, but its gateway can be asked by key whether a
  charge went through: a status lookup that settles a crash gap.
- ``charge_stripped``: a false declaration, for the duplicate-side-effect alert: it declares a
  downstream that honours idempotency keys and fencing tokens, and its gateway ignores both
  (it charges every request it receives, and the handler reports each as newly applied). A
  takeover after a crash gap therefore charges twice. Only this tests' module registers it.
- ``echo_text``: a read whose downstream answers with a NUL character (Postgres text cannot
  hold it).
- ``echo_later``: a read whose handler is ``async def`` and awaits a sleep.
- ``crash_worker``: a read whose handler SIGKILLs its own worker process, every time (a
  poison call: an OOM kill, a segfault in a C extension).

Workers load it with ``CALLGATE_TOOLS=tests.acceptance.legacy_tools:registry``;
``registry_v2`` is the same with every tool's version bumped (a deploy during a crash gap).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from callgate.core.errors import ErrorCode, StaleFence, ToolError
from callgate.ops.lab.demo.tools import DemoServices, demo_registry
from callgate.tools.registry import (
    READ_ONLY,
    Downstream,
    ExecutionContext,
    Registry,
    SideEffect,
    Tool,
)

IRREVERSIBLE = SideEffect(idempotent=False, reversible=False)


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(gt=0)


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=100)


def registry() -> Registry:
    svc = DemoServices()
    base = demo_registry(svc)

    def record(service: str, ctx: ExecutionContext, *, fenced: bool) -> None:
        params = {"s": service, "k": ctx.idempotency_key, "f": ctx.fencing_token}
        with svc.engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO downstream.requests (service, idempotency_key, fencing_token)"
                    " VALUES (:s, :k, :f)"
                ),
                params,
            )
            if fenced:
                # Serialise on the key, then refuse a generation older than one seen.
                conn.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"), params)
                newest = conn.execute(
                    text(
                        "SELECT max(fencing_token) FROM downstream.side_effects"
                        " WHERE service = :s AND idempotency_key = :k"
                    ),
                    params,
                ).scalar()
                if newest is not None and ctx.fencing_token < newest:
                    raise StaleFence(f"fencing token {ctx.fencing_token} < {newest}")
            conn.execute(
                text(
                    "INSERT INTO downstream.side_effects"
                    " (service, idempotency_key, resource_id, action, fencing_token)"
                    " VALUES (:s, :k, 'card-1', 'charge', :f)"
                ),
                params,
            )

    def await_response() -> None:
        if os.environ.get("CALLGATE_TEST_LEGACY_RESPONSE_TIMEOUT") != "1":
            return
        try:
            with svc.engine.begin() as conn:
                conn.execute(text("SET LOCAL statement_timeout = 50"))
                conn.execute(text("SELECT pg_sleep(1)"))
        except OperationalError as exc:  # the charge committed; its reply never came
            raise ToolError(
                "the gateway did not answer in time", code=ErrorCode.UPSTREAM_UNAVAILABLE
            ) from exc

    def charge_legacy(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("charge_legacy", 0)
        record("legacy", ctx, fenced=False)
        await_response()
        svc.pause("charge_legacy", 1)
        if os.environ.get("CALLGATE_TEST_LEGACY_RECEIPT") == "1":
            # Fetch a receipt on the gateway's connection: if that connection was cut meanwhile,
            # the driver raises its own error (not a ToolError) after the charge applied.
            with svc.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        return {"charged": args.amount}

    def charge_fenced(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("charge_fenced", 0)
        record("fenced", ctx, fenced=True)
        svc.pause("charge_fenced", 1)
        return {"charged": args.amount}

    def charge_lookup(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("charge_lookup", 0)
        record("lookup", ctx, fenced=False)
        svc.pause("charge_lookup", 1)
        return {"charged": args.amount}

    def charge_stripped(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("charge_stripped", 0)
        record("stripped", ctx, fenced=False)  # key and token sent, and ignored
        ctx.report_effect(applied=True)  # the gateway says: charged now
        svc.pause("charge_stripped", 1)
        return {"charged": args.amount}

    def find_charge(args: Any, ctx: ExecutionContext) -> dict[str, Any] | None:
        with svc.engine.connect() as conn:
            found = conn.execute(
                text(
                    "SELECT count(*) FROM downstream.side_effects"
                    " WHERE service = 'lookup' AND idempotency_key = :k"
                ),
                {"k": ctx.idempotency_key},
            ).scalar()
        return {"charged": args.amount, "found_by_lookup": True} if found else None

    def echo_text(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        return {"text": args.text + "\x00", "note": "ends in NUL"}

    async def echo_later(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        await asyncio.sleep(float(os.environ.get("CALLGATE_TEST_ASYNC_SECONDS", "0.3")))
        return {"text": args.text, "note": "async"}

    def crash_worker(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    extra = [
        Tool(
            "charge_legacy",
            "Charge the card on file through the legacy gateway. Not for refunds.",
            ChargeArgs,
            "write",
            charge_legacy,
            effect=IRREVERSIBLE,
            downstream=Downstream(),
        ),
        Tool(
            "charge_fenced",
            "Charge the card on file through a gateway that checks fencing tokens.",
            ChargeArgs,
            "write",
            charge_fenced,
            effect=IRREVERSIBLE,
            downstream=Downstream(fencing=True),
        ),
        Tool(
            "charge_lookup",
            "Charge the card on file through a gateway that can be asked about a charge.",
            ChargeArgs,
            "write",
            charge_lookup,
            effect=IRREVERSIBLE,
            downstream=Downstream(status_lookup=True),
            lookup=find_charge,
        ),
        Tool(
            "charge_stripped",
            "Charge the card on file through a gateway that claims to deduplicate.",
            ChargeArgs,
            "write",
            charge_stripped,
            effect=IRREVERSIBLE,
            # False: the gateway honours neither (see the module's docstring).
            downstream=Downstream(idempotency_keys=True, fencing=True),
        ),
        Tool(
            "echo_text",
            "Echo a text through a downstream that appends a NUL.",
            EchoArgs,
            "read",
            echo_text,
            effect=READ_ONLY,
        ),
        Tool(
            "echo_later",
            "Echo a text after a while, from an async handler.",
            EchoArgs,
            "read",
            echo_later,
            effect=READ_ONLY,
        ),
        Tool(
            "crash_worker",
            "Crash the worker that runs it.",
            EchoArgs,
            "read",
            crash_worker,
            effect=READ_ONLY,
        ),
    ]
    allowlist = {role: sorted(names) for role, names in base.allowlist.items()}
    allowlist["support"].extend(t.name for t in extra)
    return Registry.of([*base.tools.values(), *extra], allowlist)


def registry_v2() -> Registry:
    """The same tools after a deploy that bumped every tool's version."""
    base = registry()
    bumped = [dataclasses.replace(t, version=f"{t.version}+2") for t in base.tools.values()]
    return Registry.of(bumped, {r: sorted(n) for r, n in base.allowlist.items()})
