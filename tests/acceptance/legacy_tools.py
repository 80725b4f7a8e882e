"""A registry for tests: the demo tools plus a write whose downstream offers nothing.

``charge_legacy`` is irreversible and not idempotent, and its downstream takes no
idempotency key, no fencing token and has no status lookup: SPEC §7's last row. Workers load
it with ``CALLGATE_TOOLS=tests.acceptance.legacy_tools:registry``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from worker.demo.tools import DemoServices, demo_registry
from worker.registry import Downstream, ExecutionContext, Registry, SideEffect, Tool


class ChargeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int = Field(gt=0)


def registry() -> Registry:
    svc = DemoServices()
    base = demo_registry(svc)

    def charge_legacy(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        svc.pause("charge_legacy", 0)
        with svc.engine.begin() as conn:
            params = {"k": ctx.idempotency_key, "f": ctx.fencing_token}
            conn.execute(
                text(
                    "INSERT INTO downstream.requests (service, idempotency_key, fencing_token)"
                    " VALUES ('legacy', :k, :f)"
                ),
                params,
            )
            conn.execute(
                text(
                    "INSERT INTO downstream.side_effects"
                    " (service, idempotency_key, resource_id, action, fencing_token)"
                    " VALUES ('legacy', :k, 'card-1', 'charge', :f)"
                ),
                params,
            )
        svc.pause("charge_legacy", 1)
        return {"charged": args.amount}

    legacy = Tool(
        "charge_legacy",
        "Charge the card on file through the legacy gateway. Not for refunds.",
        ChargeArgs,
        "write",
        charge_legacy,
        effect=SideEffect(idempotent=False, reversible=False),
        downstream=Downstream(),
    )
    allowlist = {role: sorted(names) for role, names in base.allowlist.items()}
    allowlist["support"].append("charge_legacy")
    return Registry.of([*base.tools.values(), legacy], allowlist)
