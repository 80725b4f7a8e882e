"""LocalRunner: a call through the worker's gate and the handler, with no service."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

from callgate import Downstream, ExecutionContext, Registry, SideEffect, tool
from callgate.core.errors import ErrorCode, ToolError
from callgate.testing import AwaitingApproval, LocalRunner
from callgate.tools.intent import idempotency_key
from callgate.tools.registry import Facts, Principal

RUNS: dict[str, int] = {"lookup": 0, "refund": 0}


@tool
def lookup(order_id: str) -> dict[str, Any]:
    """Look an order up."""
    RUNS["lookup"] += 1
    return {"order_id": order_id, "state": "paid"}


def _no_more_than_100(args: Any, facts: Facts, who: Principal) -> None:
    if args.amount > 100:
        raise ToolError("refund too large", code=ErrorCode.REFUND_AMOUNT_EXCEEDED)


def _over_50_needs_approval(args: Any, facts: Facts, who: Principal) -> dict[str, Any] | None:
    return {"amount": args.amount} if args.amount > 50 else None


@tool(
    kind="write",
    effect=SideEffect(idempotent=False, reversible=False),
    downstream=Downstream(idempotency_keys=True),
    validate=_no_more_than_100,
    risk=_over_50_needs_approval,
)
def refund(order_id: str, amount: int, ctx: ExecutionContext) -> dict[str, Any]:
    """Refund an order."""
    RUNS["refund"] += 1
    return {"operation": ctx.operation_id, "fence": ctx.fencing_token}


@tool
def busy_lookup(order_id: str) -> dict[str, Any]:
    """Look an order up in a downstream that asks to be called again later."""
    RUNS["lookup"] += 1
    raise ToolError("busy", code=ErrorCode.UPSTREAM_UNAVAILABLE, retry_after_ms=750)


REGISTRY = Registry.of(
    [lookup, refund, busy_lookup], {"support": ["lookup", "refund", "busy_lookup"]}
)
ALICE = Principal("acme", "alice", ("support",))


def test_a_read_runs_its_handler_once() -> None:
    before = RUNS["lookup"]
    result = LocalRunner(REGISTRY).call("lookup", {"order_id": "o1"}, principal=ALICE)
    assert result.status == "succeeded"
    assert result.data["content"] == {"order_id": "o1", "state": "paid"}
    assert RUNS["lookup"] == before + 1


def test_a_retryable_failure_carries_the_downstreams_hint_as_a_worker_would() -> None:
    before = RUNS["lookup"]
    result = LocalRunner(REGISTRY).call("busy_lookup", {"order_id": "o1"}, principal=ALICE)
    assert RUNS["lookup"] == before + 1
    assert result.status == "failed_retryable"
    assert result.error.code == "upstream_unavailable"
    assert result.model_dump(mode="json")["error"]["retry_after_ms"] == 750


def test_a_keyed_write_gets_a_first_delivery_key_and_fence() -> None:
    runner = LocalRunner(REGISTRY)
    result = runner.call(
        "refund", {"order_id": "o1", "amount": 10}, principal=ALICE, operation_id="op-7"
    )
    assert result.status == "succeeded"
    key = idempotency_key("acme", "refund", "op-7")
    assert result.data["content"] == {"operation": "op-7", "fence": 1}
    assert [c.idempotency_key for c in runner.contexts] == [key]


def test_schema_and_rule_refusals_run_no_handler() -> None:
    before = RUNS["refund"]
    runner = LocalRunner(REGISTRY)
    bad = runner.call("refund", {"order_id": "o1", "amount": "ten"}, principal=ALICE)
    assert bad.status == "failed_terminal" and bad.error.code == "invalid_arguments"
    big = runner.call("refund", {"order_id": "o1", "amount": 500}, principal=ALICE)
    assert big.status == "failed_terminal" and big.error.code == "refund_amount_exceeded"
    assert RUNS["refund"] == before


def test_a_call_needing_approval_waits_then_runs_once_approved() -> None:
    before = RUNS["refund"]
    runner = LocalRunner(REGISTRY)
    parked = runner.call("refund", {"order_id": "o1", "amount": 80}, principal=ALICE)
    assert isinstance(parked, AwaitingApproval) and parked.impact == {
        "amount": 80,
        "reversible": False,
    }
    assert RUNS["refund"] == before
    own = runner.call(
        "refund", {"order_id": "o1", "amount": 80}, principal=ALICE, approved_by="alice"
    )
    assert own.status == "failed_terminal" and own.error.code == "approval_forbidden"
    ran = runner.call(
        "refund", {"order_id": "o1", "amount": 80}, principal=ALICE, approved_by="bob"
    )
    assert ran.status == "succeeded"
    assert RUNS["refund"] == before + 1


def test_nothing_connects_and_no_driver_is_imported() -> None:
    code = textwrap.dedent(
        """
        import sys
        from callgate import Registry, tool
        from callgate.testing import LocalRunner

        @tool
        def ping(text: str) -> dict:
            '''Echo.'''
            return {"text": text}

        result = LocalRunner(Registry.of([ping], {"r": ["ping"]})).call("ping", {"text": "x"})
        assert result.status == "succeeded", result
        loaded = [m for m in ("redis", "rq", "sqlalchemy", "psycopg") if m in sys.modules]
        assert not loaded, loaded
        """
    )
    env = {
        **os.environ,
        "CALLGATE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none",
        "CALLGATE_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
