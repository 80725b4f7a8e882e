"""A chaos run with real processes: workers SIGKILLed, Redis flushed twice, Postgres backends
terminated, while turns of reads and writes are in flight. Afterwards every call has
exactly one terminal result, and no operation took effect downstream twice."""

from __future__ import annotations

import os
import random
import signal
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from callgate.core.types import Turn
from callgate.ops.stack import Stack, wait_for_workers
from callgate.producer import Producer
from tests.acceptance.conftest import SUPPORT_A, wait_until
from tests.acceptance.private_stack import database_url, env, make_producer
from tests.acceptance.processes import PrivateRedis, private_redis, terminate_backends

__all__ = ["database_url", "env", "make_producer", "private_redis"]  # fixtures, for pytest

WORKERS = 3
TURNS = 24


def _turn(i: int) -> list[dict[str, object]]:
    """A read, and one write of a kind chosen by ``i``: keyed, unkeyed or a refund."""
    write: dict[str, object]
    if i % 3 == 0:
        write = {"tool_name": "send_email", "arguments": {"to": f"u{i}@x.test", "template": "hi"}}
    elif i % 3 == 1:
        write = {"tool_name": "charge_legacy", "arguments": {"amount": i + 1}}
    else:
        write = {
            "tool_name": "refund_payment",
            "arguments": {"order_id": "O-17", "amount": 100, "currency": "KRW"},
        }
    return [
        {"call_id": f"read-{i}", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
        {"call_id": f"write-{i}", **write},
    ]


DELAYS = "refund_payment=0:400,send_email=0:400,charge_legacy=0:400,get_stock=50"


@pytest.fixture
def producer(make_producer: Callable[..., Producer]) -> Producer:
    return make_producer()


def test_chaos_leaves_every_call_terminal_and_every_write_applied_at_most_once(
    env: dict[str, str],
    producer: Producer,
    engine: Engine,
    private_redis: PrivateRedis,
    fresh_payments: None,
) -> None:
    rng = random.Random(int(os.environ.get("CALLGATE_CHAOS_SEED", "8")))
    stack = Stack(env={**env, "CALLGATE_DEMO_DELAY_MS": DELAYS}, workers=WORKERS)
    stack.__enter__()
    try:
        wait_for_workers(private_redis.url, env["CALLGATE_QUEUE"], WORKERS)
        turns = []
        # Faults interleaved with submissions, each landing while calls are in flight:
        # every worker killed inside a write's crash gap, then the job the sweeper re-issued
        # flushed from Redis before anyone could take it; Postgres backends terminated.
        faults = ["gap_then_flush", "terminate", "kill", "gap_then_flush", "terminate"]
        for i in range(TURNS):
            turns.append(producer.submit(_turn(i), {**SUPPORT_A, "request_id": f"chaos-{i}"}))
            if i % 4 == 3 and faults:
                _inject(faults.pop(0), stack, engine, private_redis, rng, turns)
        while faults:
            _inject(faults.pop(0), stack, engine, private_redis, rng, turns)

        def all_terminal() -> bool:
            with engine.connect() as conn:
                open_calls = conn.execute(
                    text(
                        "SELECT count(*) FROM callgate.calls WHERE turn_id = ANY(:turns)"
                        " AND state NOT IN ('succeeded', 'failed_retryable', 'failed_terminal')"
                    ),
                    {"turns": ids},
                ).scalar()
            return open_calls == 0

        ids = [uuid.UUID(t.turn_id) for t in turns]
        wait_until(all_terminal, timeout=90, what="every call to end")
        for turn in turns:
            collected = producer.collect(turn.turn_id, timeout=30)
            assert collected.complete, collected.pending
    finally:
        stack.stop()

    # Only this test's turns: the database is shared by the test session.
    mine = {"turns": ids}
    with engine.connect() as conn:
        per_call = conn.execute(
            text(
                "SELECT c.id, count(o.id) AS n FROM callgate.calls c"
                " LEFT JOIN callgate.outbox o ON o.call_ref = c.id"
                " WHERE c.turn_id = ANY(:turns) GROUP BY c.id"
            ),
            mine,
        ).all()
        twice = conn.execute(
            text(
                "SELECT s.idempotency_key, s.resource_id, count(*)"
                " FROM downstream.side_effects s"
                " JOIN callgate.operations o ON o.idempotency_key = s.idempotency_key"
                " JOIN callgate.calls c USING (operation_id)"
                " WHERE c.turn_id = ANY(:turns)"
                " GROUP BY s.idempotency_key, s.resource_id HAVING count(*) > 1"
            ),
            mine,
        ).all()
        outcomes = dict(
            conn.execute(
                text(
                    "SELECT c.tool_name || ':' || coalesce(c.result #>> '{error,code}', c.state),"
                    " count(*) FROM callgate.calls c WHERE c.turn_id = ANY(:turns) GROUP BY 1"
                ),
                mine,
            ).all()
        )
        succeeded_without_effect = conn.execute(
            text(
                "SELECT c.call_id FROM callgate.calls c"
                " JOIN callgate.operations o USING (operation_id)"
                " WHERE c.turn_id = ANY(:turns)"
                " AND c.kind = 'write' AND c.state = 'succeeded' AND NOT EXISTS"
                " (SELECT 1 FROM downstream.side_effects s"
                "   WHERE s.idempotency_key = o.idempotency_key)"
            ),
            mine,
        ).all()
        refunded = conn.execute(
            text("SELECT refunded FROM downstream.payments WHERE order_id = 'O-17'")
        ).scalar()
    print("chaos outcomes:", outcomes)
    assert len(per_call) == 2 * TURNS
    assert all(row.n == 1 for row in per_call), "exactly one terminal result per call"
    assert twice == [], "an operation took effect downstream twice"
    assert succeeded_without_effect == []
    # Every refund that succeeded moved the balance once, and only those did.
    assert refunded == 100 * outcomes.get("refund_payment:succeeded", 0)


def _inject(
    fault: str,
    stack: Stack,
    engine: Engine,
    redis_server: PrivateRedis,
    rng: random.Random,
    turns: list[Turn],
) -> None:
    if fault == "gap_then_flush":
        in_gap = wait_until(
            lambda: _crash_gap(engine, turns), timeout=10, what="a write in its gap"
        )
        workers = _workers(stack)
        for name in workers:
            stack.signal(name, signal.SIGKILL)
        for name in workers:
            stack.procs[name].wait()
        ref, dispatches = in_gap[0]
        wait_until(lambda: _dispatches(engine, ref) > dispatches, what="the sweeper to re-dispatch")
        redis_server.flush()  # the re-dispatched job is lost too
        for name in workers:
            stack.start_worker(f"{name}-r{uuid.uuid4().hex[:6]}")
    elif fault == "kill":
        victim = rng.choice(_workers(stack))
        stack.signal(victim, signal.SIGKILL)
        stack.procs[victim].wait()
        stack.start_worker(f"{victim}-r{uuid.uuid4().hex[:6]}")
    elif fault == "terminate":
        for app in ("callgate-worker", "callgate-relayer", "callgate-sweeper"):
            terminate_backends(engine, app)


def _workers(stack: Stack) -> list[str]:
    return [n for n, p in stack.procs.items() if n.startswith("worker") and p.poll() is None]


def _crash_gap(engine: Engine, turns: list[Turn]) -> list[tuple[object, int]]:
    """Writes whose downstream effect landed while their call is still open."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT c.id, c.dispatches FROM callgate.calls c"
                " JOIN callgate.operations o USING (operation_id)"
                " WHERE c.turn_id = ANY(:turns)"
                " AND c.kind = 'write' AND c.state = 'started' AND EXISTS"
                " (SELECT 1 FROM downstream.side_effects s"
                "   WHERE s.idempotency_key = o.idempotency_key)"
            ),
            {"turns": [uuid.UUID(t.turn_id) for t in turns]},
        ).all()
    return [(r.id, r.dispatches) for r in rows]


def _dispatches(engine: Engine, ref: object) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT dispatches FROM callgate.calls WHERE id = :r"), {"r": ref}
            ).scalar()
        )
