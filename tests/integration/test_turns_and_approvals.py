"""Recording rules and approval recovery against real Postgres and Redis (no workers)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import Engine, text

from callgate.core.errors import InputError
from callgate.core.types import CallContext, ProposedCall
from callgate.daemons import sweeper
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.queue import transport
from callgate.store import approvals, completions, db, migrate, reservations, turns

A = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
B = CallContext(request_id="r", tenant_id="tenant-b", user_id="user-42", roles=("support",))
REFUND = {"order_id": "O-17", "amount": 1, "currency": "KRW"}


def _planned(
    ctx: CallContext, op: str | None = None, tool: str = "refund_payment"
) -> turns.PlannedCall:
    call = ProposedCall(
        call_id="c1",
        tool_name=tool,
        arguments=REFUND if tool == "refund_payment" else {"to": "a@b", "template": "t"},
    )
    (p,) = plan([call], ctx, demo_registry(), {"c1": op} if op else None)
    return p


def _count(engine: Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def test_an_operation_id_of_another_tenant_or_tool_is_refused_and_nothing_is_recorded(
    engine: Engine,
) -> None:
    first = _planned(A)
    turns.record(engine, A, [first])
    before = _count(engine, "SELECT count(*) FROM callgate.turns")
    with pytest.raises(InputError) as info:
        turns.record(engine, B, [_planned(B, first.operation_id)])
    assert "another tenant or tool" in info.value.message
    with pytest.raises(InputError):
        turns.record(engine, A, [_planned(A, first.operation_id, tool="send_email")])
    assert _count(engine, "SELECT count(*) FROM callgate.turns") == before
    # The same tenant and tool may reuse it: that is how a logical write is retried.
    turns.record(engine, A, [_planned(A, first.operation_id)])


@pytest.fixture
def own_engine(make_database: Callable[[], str]) -> Iterator[Engine]:
    """A database of this test's own: a sweep reads every open call in its database."""
    eng = db.create(make_database(), pool_size=4)
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


def test_the_sweeper_resumes_a_call_parked_on_a_request_decided_meanwhile(
    own_engine: Engine, redis_url: str, queue_name: str
) -> None:
    engine = own_engine
    p = _planned(A)
    turn_id, _ = turns.record(engine, A, [p])
    settled = approvals.settle(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        tool_name="refund_payment",
        tenant_id="tenant-a",
        requested_by="user-17",
        intent_hash="intent-1",
        policy_version="1",
        impact={"amount": 1},
    )
    assert settled.state == "pending" and settled.parked
    # The race the sweeper closes: the request was decided by a statement that could not
    # see this call parked yet, so nothing resumed it.
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE callgate.approvals SET state = 'approved', decided_by = 'alice'"
                " WHERE approval_id = :a"
            ),
            {"a": settled.approval_id},
        )
    queue = transport.job_queue(redis.Redis.from_url(redis_url), queue_name)
    swept = sweeper.sweep_once(engine, queue, stale_seconds=3600, job_timeout=60, max_dispatches=10)
    assert swept.dispatched == [p.ref]
    assert (
        _count(
            engine,
            "SELECT count(*) FROM callgate.calls WHERE id = :r AND state = 'proposed'",
            r=p.ref,
        )
        == 1
    )
    assert queue.count == 1
    # Only once: the call is no longer parked.
    again = sweeper.sweep_once(engine, queue, stale_seconds=3600, job_timeout=60, max_dispatches=10)
    assert again.dispatched == [] and again.ended == []
    queue.empty()


def test_settle_is_idempotent_and_a_second_intent_supersedes_the_first(engine: Engine) -> None:
    p1 = _planned(A)
    turn_id, _ = turns.record(engine, A, [p1])
    kwargs = dict(
        operation_id=p1.operation_id,
        turn_id=turn_id,
        tool_name="refund_payment",
        tenant_id="tenant-a",
        requested_by="user-17",
        policy_version="1",
        impact={"amount": 1},
    )
    first = approvals.settle(engine, call_ref=p1.ref, intent_hash="intent-1", **kwargs)
    again = approvals.settle(engine, call_ref=p1.ref, intent_hash="intent-1", **kwargs)
    assert again.approval_id == first.approval_id and not again.parked  # already parked
    p2 = _planned(A, p1.operation_id)
    turn2, _ = turns.record(engine, A, [p2])
    other = approvals.settle(
        engine, call_ref=p2.ref, intent_hash="intent-2", **{**kwargs, "turn_id": turn2}
    )
    assert other.version == 2 and other.parked
    # The first call asked for another intent under this key: it ends, with a result.
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT state, result FROM callgate.calls WHERE id = :r"), {"r": p1.ref}
        ).one()
    assert row.state == "failed_terminal"
    assert row.result["error"]["code"] == "idempotency_conflict"
    assert _count(engine, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=p1.ref) == 1
    states = [
        a["state"]
        for a in approvals.requests(engine, tenant="tenant-a", state=None)
        if a["operation_id"] == p1.operation_id
    ]
    assert states == ["superseded", "pending"]


def test_a_refusal_never_ends_a_call_a_delivery_has_started(engine: Engine) -> None:
    p = _planned(A)
    turn_id, _ = turns.record(engine, A, [p])
    owner = uuid.uuid4()
    reserved = reservations.reserve(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        owner_token=owner,
        intent_hash="intent-1",
        lease_seconds=30,
    )
    assert isinstance(reserved, reservations.Reserved)
    refused = reservations.reject(
        engine,
        call_ref=p.ref,
        status="failed_retryable",
        error={"code": "upstream_unavailable", "details": []},
    )
    assert refused.finished == 0
    lease = reservations.Lease(p.operation_id, owner, reserved.generation, "intent-1")
    done = completions.complete(engine, lease, status="succeeded", payload={"ok": True})
    assert done.won and done.finished == 1


def _record_turn(engine: Engine, ctx: CallContext, *topics: str, budget: int = 2) -> list[str]:
    """Record get_news calls through the budget rules; return each call's error code or ''."""
    from callgate.producer.budgets import apply_budgets

    calls = [
        ProposedCall(call_id=f"c{i}", tool_name="get_news", arguments={"topic": t})
        for i, t in enumerate(topics)
    ]
    planned = plan(calls, ctx, demo_registry())
    _, recorded = turns.record(
        engine,
        ctx,
        planned,
        lambda facts: apply_budgets(planned, facts, turn_budget=budget, conversation_budget=100),
    )
    return [p.refusal["code"] if p.refusal else "" for p in recorded]


def test_a_call_only_refused_by_a_budget_is_not_a_repeat_and_conversations_are_per_tenant(
    engine: Engine,
) -> None:
    conv = f"conv-{uuid.uuid4().hex[:8]}"
    a = A.model_copy(update={"conversation_id": conv})
    b = B.model_copy(update={"conversation_id": conv})
    assert _record_turn(engine, a, "x", "y", "z") == ["", "", "budget_exceeded"]
    # "z" never ran: proposing it again is not a repeated call.
    assert _record_turn(engine, a, "z") == [""]
    # Mark "z" failed as a worker would (terminal), then it is a repeat in tenant-a only.
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE callgate.calls SET state = 'failed_terminal', result = CAST(:r AS jsonb)"
                " WHERE state = 'proposed' AND arguments = CAST(:args AS jsonb)"
                "   AND turn_id IN (SELECT turn_id FROM callgate.turns"
                "                    WHERE conversation_id = :c AND tenant_id = 'tenant-a')"
            ),
            {
                "r": '{"status": "failed_terminal", "error": {"code": "not_found", "details": []}}',
                "args": '{"topic": "z"}',
                "c": conv,
            },
        )
    assert _record_turn(engine, a, "z") == ["repeated_call"]
    assert _record_turn(engine, b, "z") == [""]
