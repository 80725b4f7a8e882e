"""``LocalRunner`` (an application's unit tests of its tools) and the worker end the same
calls the same way: the same cases through both, the worker's outcome read from the call it
committed in PostgreSQL, compared status and error code. Real Postgres and Redis for the
worker; the gate functions are shared, so this keeps them shared."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, text

from callgate.core.errors import ErrorCode, ToolError
from callgate.testing import LocalRunner
from callgate.tools.registry import (
    READ_ONLY,
    Downstream,
    ExecutionContext,
    Facts,
    Principal,
    Registry,
    SideEffect,
    Tool,
)
from callgate.worker import executor
from tests.integration.worlds import in_process

WHO = Principal("t1", "u1", ("support",))
CONTEXT = {"request_id": "req-agree", "tenant_id": "t1", "user_id": "u1", "roles": ["support"]}
MALLORY = {**CONTEXT, "user_id": "mallory"}


class OrderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str
    amount: int = 0


def _resolve(args: Any, who: Principal) -> Facts:
    if args.order_id == "down":
        raise ConnectionError("the orders service is down")  # not retried away: not transient
    if args.order_id == "bug":
        raise RuntimeError("a bug in the lookup")
    if args.order_id == "missing":
        raise ToolError("no such order", code=ErrorCode.NOT_FOUND)
    return Facts(canonical={"order": args.order_id}, state={"paid": 100})


def _business(args: Any, facts: Facts, who: Principal) -> None:
    if args.amount > facts.state["paid"]:
        raise ToolError("more than was paid", code=ErrorCode.REFUND_AMOUNT_EXCEEDED)


def _authorize(args: Any, facts: Facts, who: Principal) -> None:
    if who.user_id == "mallory":
        raise ToolError("not yours", code=ErrorCode.PERMISSION_DENIED)


def _handler(args: Any, ctx: ExecutionContext) -> dict[str, Any]:
    if args.order_id == "crash":
        raise ValueError("handler bug")
    return {"order_id": args.order_id, "amount": args.amount}


def registry() -> Registry:
    common: dict[str, Any] = {
        "resolve": _resolve,
        "validate": _business,
        "authorize": _authorize,
    }
    return Registry.of(
        [
            Tool(
                "get_order",
                "Read an order.",
                OrderArgs,
                "read",
                _handler,
                effect=READ_ONLY,
                **common,
            ),
            Tool(
                "refund",
                "Refund an order.",
                OrderArgs,
                "write",
                _handler,
                effect=SideEffect(idempotent=False, reversible=False),
                downstream=Downstream(idempotency_keys=True),
                **common,
            ),
        ],
        {"support": ["get_order", "refund"]},
    )


CASES: list[tuple[str, str, dict[str, Any] | str, dict[str, Any]]] = [
    ("ok read", "get_order", {"order_id": "A-1"}, CONTEXT),
    ("ok write", "refund", {"order_id": "A-1", "amount": 5}, CONTEXT),
    ("unknown tool", "delete_everything", {"order_id": "A-1"}, CONTEXT),
    ("bad json", "get_order", '{"order_id": ', CONTEXT),
    ("schema", "get_order", {"order_id": 7}, CONTEXT),
    ("lookup down", "get_order", {"order_id": "down"}, CONTEXT),
    ("lookup bug", "refund", {"order_id": "bug", "amount": 1}, CONTEXT),
    ("lookup refuses", "get_order", {"order_id": "missing"}, CONTEXT),
    ("business", "refund", {"order_id": "A-2", "amount": 500}, CONTEXT),
    ("authorization", "refund", {"order_id": "A-3", "amount": 1}, MALLORY),
    ("handler bug (read)", "get_order", {"order_id": "crash"}, CONTEXT),
]


@pytest.fixture
def worker_side(database_url: str, redis_url: str, queue_name: str) -> Iterator[Any]:
    rt, producer, engine = in_process(
        database_url, redis_url, queue_name, registry(), CALLGATE_RETRY_ATTEMPTS="1"
    )
    yield rt, producer, engine
    engine.dispose()


def _outcome_of(engine: Engine, ref: uuid.UUID) -> tuple[str, str | None]:
    with engine.connect() as conn:
        state, result = conn.execute(
            text("SELECT state, result FROM callgate.calls WHERE id = :r"), {"r": ref}
        ).one()
    return state, (result.get("error") or {}).get("code")


@pytest.mark.parametrize(("case", "tool", "arguments", "context"), CASES, ids=[c[0] for c in CASES])
def test_the_worker_and_the_local_runner_end_a_call_the_same_way(
    worker_side: Any, case: str, tool: str, arguments: Any, context: dict[str, Any]
) -> None:
    rt, producer, engine = worker_side
    turn = producer.submit(
        [{"call_id": "c1", "tool_name": tool, "arguments": arguments}],
        {**context, "request_id": f"req-{uuid.uuid4().hex[:8]}"},
    )
    (call,) = turn.calls
    executor.execute(rt, uuid.UUID(call.ref))
    in_worker = _outcome_of(engine, uuid.UUID(call.ref))

    who = Principal(context["tenant_id"], context["user_id"], tuple(context["roles"]))
    local = LocalRunner(registry()).call(tool, arguments, principal=who)
    error = getattr(local, "error", None)
    in_runner = (local.status, error.code if error is not None else None)

    assert in_runner == in_worker, case
