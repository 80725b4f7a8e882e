"""The gate through real worker processes, counted at the downstream.

Counts are ground truth, never a returned boolean: ``downstream.requests`` rows are handler
invocations that reached the payments provider, ``downstream.side_effects`` rows are
refunds applied.
"""

from __future__ import annotations

import json
import signal
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import Engine, text

from callgate.ops.lab.demo import downstream
from callgate.ops.lab.demo.tools import DEFAULT_APPROVAL_AMOUNT, DemoServices, demo_registry
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import approvals
from callgate.tools.intent import idempotency_key, intent_hash
from callgate.tools.registry import Principal
from tests.acceptance.conftest import (
    SUPPORT_A,
    call_row,
    callgate,
    effects_for,
    requests_for,
    scalar,
    trace_events,
    wait_until,
)

SUPPORT_B = {
    "request_id": "req-b",
    "tenant_id": "tenant-b",
    "user_id": "user-42",
    "roles": ["support"],
}
PAYMENT = 2_000_000  # every order of this file starts with one payment of this many KRW
NEEDS_APPROVAL = 1_000_000  # at or above DEFAULT_APPROVAL_AMOUNT
NO_APPROVAL = 50_000
TOO_MUCH = 3_000_000  # more than PAYMENT
assert NO_APPROVAL < DEFAULT_APPROVAL_AMOUNT <= NEEDS_APPROVAL < PAYMENT < TOO_MUCH


def new_order(engine: Engine, tenant: str, amount: int = PAYMENT) -> tuple[str, str]:
    order, payment = f"O-{uuid.uuid4().hex[:8]}", f"pay-{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        downstream.add_payment(conn, order, tenant, f"merchant-{tenant}", payment, amount, "KRW")
    return order, payment


def refund(order: str, amount: Any) -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "currency": "KRW"}


def submit_one(
    producer: Producer, ctx: dict[str, Any], tool: str, args: Any, op: str | None = None
) -> tuple[str, str, str, str]:
    """Submit a one-call turn; returns (turn_id, call ref, operation id, idempotency key)."""
    call_id = f"call-{uuid.uuid4().hex[:6]}"
    turn = producer.submit(
        [{"call_id": call_id, "tool_name": tool, "arguments": args}],
        ctx,
        operation_ids={call_id: op} if op else None,
    )
    c = turn.calls[0]
    return (
        turn.turn_id,
        c.ref,
        c.operation_id,
        idempotency_key(ctx["tenant_id"], tool, c.operation_id),
    )


def pre_approve(
    producer: Producer, engine: Engine, op: str, ctx: dict[str, Any], args: dict[str, Any]
) -> None:
    """Put an approval, granted, on ``op`` for the intent these *valid* arguments have.

    The intent is computed with the demo registry's own resolver, as a worker does; if this
    drifted from the executor, the "normal-allowed" row would park instead of running.
    """
    registry = demo_registry(DemoServices(producer.settings))
    tool = registry.tools["refund_payment"]
    parsed = tool.arguments.model_validate(args)  # type: ignore[union-attr]
    principal = Principal(ctx["tenant_id"], ctx["user_id"], tuple(ctx["roles"]))
    assert tool.resolve is not None and tool.risk is not None
    facts = tool.resolve(parsed, principal)
    intent = intent_hash(
        arguments=parsed.model_dump(mode="json"),
        tenant_id=ctx["tenant_id"],
        user_id=ctx["user_id"],
        tool_name=tool.name,
        tool_version=tool.version,
        schema_version=tool.schema_version,
        resource=facts.canonical,
        scope=registry.scope_of(tool.name, ctx["roles"]),
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO callgate.approvals (approval_id, operation_id, version, tool_name,"
                " tenant_id, requested_by, intent_hash, policy_version, impact, state,"
                " decided_by, decided_at)"
                " VALUES (:id, :op, 1, :tool, :tenant, :user, :intent, :pv, CAST(:impact AS jsonb),"
                " 'approved', 'approver-1', now())"
            ),
            {
                "id": uuid.uuid4(),
                "op": op,
                "tool": tool.name,
                "tenant": ctx["tenant_id"],
                "user": ctx["user_id"],
                "intent": intent,
                "pv": tool.policy_version,
                "impact": json.dumps(tool.risk(parsed, facts, principal)),
            },
        )


def approvals_of(engine: Engine, op: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT approval_id, version, state, impact FROM callgate.approvals"
                " WHERE operation_id = :op ORDER BY version"
            ),
            {"op": op},
        ).mappings()
        return [dict(r) for r in rows]


def final(engine: Engine, ref: str) -> dict[str, Any]:
    """Wait until the call is terminal or parked; return its row."""
    return wait_until(
        lambda: (
            (row := call_row(engine, ref))["state"]
            in ("succeeded", "failed_terminal", "failed_retryable", "awaiting_approval")
            and row
        ),
        what=f"call {ref} to settle",
    )


# --- the 23-row gate table ---------------------------------------------------------


GATE_TABLE: list[tuple[str, dict[str, bool], int]] = [
    ("normal-allowed", {}, 1),
    ("approval-not-required", {"approval_required": False, "approval_granted": False}, 1),
    ("required-but-missing", {"approval_granted": False}, 0),
    ("tool-not-allowed", {"allowed": False}, 0),
    ("schema-invalid", {"schema_valid": False}, 0),
    ("business-invalid", {"business_valid": False}, 0),
    ("unauthorized", {"authorized": False}, 0),
    ("not-allowed-even-approved", {"allowed": False, "approval_granted": True}, 0),
    ("schema-invalid-even-approved", {"schema_valid": False, "approval_granted": True}, 0),
    ("business-invalid-even-approved", {"business_valid": False, "approval_granted": True}, 0),
    ("unauthorized-even-approved", {"authorized": False, "approval_granted": True}, 0),
    ("allow-and-schema-fail", {"allowed": False, "schema_valid": False}, 0),
    ("allow-and-business-fail", {"allowed": False, "business_valid": False}, 0),
    ("allow-and-auth-fail", {"allowed": False, "authorized": False}, 0),
    ("schema-and-business-fail", {"schema_valid": False, "business_valid": False}, 0),
    ("schema-and-auth-fail", {"schema_valid": False, "authorized": False}, 0),
    ("business-and-auth-fail", {"business_valid": False, "authorized": False}, 0),
    (
        "three-policy-gates-fail",
        {"allowed": False, "schema_valid": False, "business_valid": False},
        0,
    ),
    (
        "three-data-gates-fail",
        {"schema_valid": False, "business_valid": False, "authorized": False},
        0,
    ),
    (
        "all-required-gates-fail",
        {"allowed": False, "schema_valid": False, "business_valid": False, "authorized": False},
        0,
    ),
    (
        "approval-cannot-bypass-allowlist",
        {"allowed": False, "approval_required": True, "approval_granted": True},
        0,
    ),
    (
        "approval-cannot-bypass-schema",
        {"schema_valid": False, "approval_required": True, "approval_granted": True},
        0,
    ),
    (
        "approval-cannot-bypass-auth",
        {"authorized": False, "approval_required": True, "approval_granted": True},
        0,
    ),
]


def expected_stop(d: dict[str, bool]) -> str:
    """The first layer that refuses, in gate order; or the outcome when none does.

    The business rules judge only an order of the caller's own tenant: on another tenant's
    order they say nothing, and authorization refuses it, so that a refusal never tells one
    tenant about another's amounts.
    """
    for flag, code in (("allowed", "tool_not_allowed"), ("schema_valid", "invalid_arguments")):
        if not d[flag]:
            return code
    if not d["authorized"]:
        return "permission_denied"
    if not d["business_valid"]:
        return "refund_amount_exceeded"
    if d["approval_required"] and not d["approval_granted"]:
        return "awaiting_approval"
    return "succeeded"


def test_the_23_row_gate_table_through_real_workers(producer, stack, engine):
    """Each row is a real refund_payment call whose server facts make the named gates fail.

    allowed=False: the principal only has the viewer role. schema_valid=False: the amount is
    a string. business_valid=False: the amount exceeds the payment. authorized=False: the
    order is another tenant's. approval_required=False: an amount below the threshold.
    approval_granted=True: an approval for the operation's valid intent is already granted.
    """
    assert len(GATE_TABLE) == 23
    rows = []
    for name, patch, expected in GATE_TABLE:
        d = {
            "allowed": True,
            "schema_valid": True,
            "business_valid": True,
            "authorized": True,
            "approval_required": True,
            "approval_granted": True,
            **patch,
        }
        order, _ = new_order(engine, "tenant-a" if d["authorized"] else "tenant-b")
        amount: Any = NEEDS_APPROVAL if d["approval_required"] else NO_APPROVAL
        if not d["business_valid"]:
            amount = TOO_MUCH
        if not d["schema_valid"]:
            amount = str(amount)
        ctx = {**SUPPORT_A, "request_id": f"req-{name}"}
        if not d["allowed"]:
            ctx["roles"] = ["viewer"]
        op = f"op-gate-{name}-{uuid.uuid4().hex[:6]}"
        rows.append((name, d, expected, order, amount, ctx, op))

    # Record every turn before any worker runs, so granted approvals exist first.
    submitted = []
    for name, d, expected, order, amount, ctx, op in rows:
        _, ref, op_id, key = submit_one(producer, ctx, "refund_payment", refund(order, amount), op)
        if d["approval_granted"] and d["approval_required"]:
            # Granted for this very call's intent when it has one (valid schema), else for
            # the valid arguments it would have had: either way, never a way past a layer.
            args = refund(order, amount if d["schema_valid"] else NEEDS_APPROVAL)
            pre_approve(producer, engine, op_id, ctx, args)
        submitted.append((name, d, expected, ref, op_id, key))

    stack(workers=3)
    for name, d, expected, ref, op_id, key in submitted:
        row = final(engine, ref)
        stop = expected_stop(d)
        got = (
            row["state"]
            if row["state"] in ("succeeded", "awaiting_approval")
            else (row["result"]["error"]["code"])
        )
        assert got == stop, name
        # The counts, not the verdict, are the proof.
        assert (requests_for(engine, key), effects_for(engine, key)) == (expected, expected), name
        granted_before = 1 if d["approval_granted"] and d["approval_required"] else 0
        created = 1 if stop == "awaiting_approval" else 0
        assert len(approvals_of(engine, op_id)) == granted_before + created, name


# --- the refund table -----------------------------------------------------------------------


def test_refund_table_each_row_stops_at_its_layer(producer, stack, engine):
    stack(workers=2)
    small_order, _ = new_order(engine, "tenant-a", amount=5_000)
    big_order, big_payment = new_order(engine, "tenant-a")
    foreign_order, _ = new_order(engine, "tenant-b")

    # 1. JSON parse: the arguments end mid-object.
    _, ref, _, key = submit_one(producer, SUPPORT_A, "refund_payment", '{"order_id":')
    assert final(engine, ref)["result"]["error"]["code"] == "invalid_arguments_json"
    assert requests_for(engine, key) == 0

    # 2. Schema: the amount is a string. The detail names the field, never the value.
    _, ref, _, key = submit_one(producer, SUPPORT_A, "refund_payment", refund(small_order, "10000"))
    error = final(engine, ref)["result"]["error"]
    assert error["code"] == "invalid_arguments"
    assert error["details"] == [{"path": "/amount", "code": "int_type", "expected": "integer"}]
    assert "10000" not in json.dumps(error) and requests_for(engine, key) == 0

    # 3. Business: 10,000 on a 5,000 payment; a perfectly schema-valid number.
    _, ref, op, key = submit_one(producer, SUPPORT_A, "refund_payment", refund(small_order, 10_000))
    assert final(engine, ref)["result"]["error"]["code"] == "refund_amount_exceeded"
    assert requests_for(engine, key) == 0

    # 4. Authorization: another tenant's order; no approval request is ever created.
    _, ref, op, key = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(foreign_order, NEEDS_APPROVAL)
    )
    assert final(engine, ref)["result"]["error"]["code"] == "permission_denied"
    assert requests_for(engine, key) == 0 and approvals_of(engine, op) == []

    # 5. Risk: authorized, but above the threshold → parked with a server-computed impact.
    turn_id, ref, op, key = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(big_order, NEEDS_APPROVAL)
    )
    assert final(engine, ref)["state"] == "awaiting_approval"
    (request,) = approvals_of(engine, op)
    waiting = producer.collect(turn_id, timeout=0.2)
    assert not waiting.complete and waiting.results == []
    # Disjoint: the parked call is under awaiting_approval, not also under pending.
    assert waiting.pending == []
    assert list(waiting.awaiting_approval.values()) == [str(request["approval_id"])]
    assert request["state"] == "pending" and request["impact"] == {
        "action": "refund_payment",
        "merchant_id": "merchant-tenant-a",
        "order_id": big_order,
        "payment_id": big_payment,
        "amount": NEEDS_APPROVAL,
        "currency": "KRW",
        "remaining_refundable": PAYMENT,
        "reversible": False,
    }
    assert requests_for(engine, key) == 0
    proc = callgate(
        "approvals",
        "approve",
        str(request["approval_id"]),
        "--by",
        "alice",
        "--tenant",
        "tenant-a",
        env=producer_env(producer),
    )
    assert proc.returncode == 0, proc.stderr
    collected = producer.collect(turn_id, timeout=15)
    (result,) = collected.results
    assert result.status == "succeeded"
    first = result.data["content"]
    assert (requests_for(engine, key), effects_for(engine, key)) == (1, 1)
    granted = trace_events(engine, ref, "approval_granted")
    assert granted and granted[0]["detail"]["by"] == "alice"
    # The audit trace, by the provider's call id: every layer's verdict, no owner token.
    shown = callgate("trace", result.call_id, "--json", env=producer_env(producer))
    assert shown.returncode == 0, shown.stderr
    events = json.loads(shown.stdout)
    assert [e["event"] for e in events] == [
        "approval_required",
        "approval_granted",
        "reserved",
        "completed",
    ]
    completed = events[-1]["detail"]
    assert completed["verdicts"] == {
        "allowlist": "pass",
        "parse": "pass",
        "schema": "pass",
        "business": "pass",
        "authorization": "pass",
        "risk": "approval_required",
        "approval": "granted",
    }
    assert {"request_id", "tool_call_id", "schema_version", "intent_hash"} <= set(completed)
    assert {"operation_key_hash", "duration_ms", "status"} <= set(completed)
    assert events[-1]["generation"] == 1
    # The arguments are never written to the trace (the owner token: see the takeover test).
    assert str(NEEDS_APPROVAL) not in json.dumps(events)

    # 6. Idempotency: the same operation redelivered after a timeout reuses the first result.
    turn2, ref2, _, _ = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(big_order, NEEDS_APPROVAL), op
    )
    (again,) = producer.collect(turn2, timeout=15).results
    assert again.status == "succeeded" and again.data["content"] == first
    assert (requests_for(engine, key), effects_for(engine, key)) == (1, 1)
    assert trace_events(engine, ref2, "result_reused")


def producer_env(producer: Producer) -> dict[str, str]:
    s = producer.settings
    return {
        "CALLGATE_DATABASE_URL": s.require_database(),
        "CALLGATE_REDIS_URL": s.require_redis(),
        "CALLGATE_QUEUE": s.queue,
        "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
    }


# --- four refund counterexamples ------------------------------------------------------------


def test_counterexample_amount_as_string_never_reaches_the_provider(producer, stack, engine):
    stack(workers=1)
    _, ref, _, key = submit_one(producer, SUPPORT_A, "refund_payment", refund("O-17", "12000"))
    assert final(engine, ref)["result"]["error"]["code"] == "invalid_arguments"
    assert requests_for(engine, key) == 0 and effects_for(engine, key) == 0


def test_counterexample_other_tenant_opens_no_approval(producer, stack, engine):
    stack(workers=1)
    order, _ = new_order(engine, "tenant-a")
    _, ref, op, key = submit_one(
        producer, SUPPORT_B, "refund_payment", refund(order, NEEDS_APPROVAL)
    )
    row = final(engine, ref)
    assert row["result"]["error"]["code"] == "permission_denied" and row["approval_id"] is None
    assert approvals_of(engine, op) == [] and requests_for(engine, key) == 0


def test_counterexample_approval_does_not_survive_a_new_canonical_payment(producer, stack, engine):
    stack(workers=1)
    order, first_payment = new_order(engine, "tenant-a")
    _, ref, op, key = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(order, NEEDS_APPROVAL)
    )
    assert final(engine, ref)["state"] == "awaiting_approval"
    (v1,) = approvals_of(engine, op)
    assert v1["impact"]["payment_id"] == first_payment

    # The order gets a newer payment: the canonical resource of the same arguments changes.
    with engine.begin() as conn:
        downstream.add_payment(
            conn, order, "tenant-a", "merchant-tenant-a", "pay-newer-" + op[-6:], PAYMENT, "KRW"
        )
    resumed = approvals.approve(engine, str(v1["approval_id"]), by="alice", tenant="tenant-a")
    transport.enqueue_calls(producer.queue, resumed, timeout=60)

    # The resumed call computes another intent: the old approval does not apply.
    wait_until(lambda: len(approvals_of(engine, op)) == 2, what="a second approval request")
    old, new = approvals_of(engine, op)
    assert old["state"] == "superseded" and new["state"] == "pending"
    assert new["impact"]["payment_id"] == "pay-newer-" + op[-6:]
    assert final(engine, ref)["state"] == "awaiting_approval"
    assert requests_for(engine, key) == 0 and effects_for(engine, key) == 0
    # Approving the stale version now changes nothing.
    stale = callgate(
        "approvals",
        "approve",
        str(old["approval_id"]),
        "--by",
        "alice",
        "--tenant",
        "tenant-a",
        env=producer_env(producer),
    )
    assert stale.returncode == 2 and "approval_not_pending" in stale.stderr


def test_denied_approval_ends_the_call_with_approval_denied(producer, stack, engine):
    stack(workers=1)
    order, _ = new_order(engine, "tenant-a")
    turn_id, ref, op, key = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(order, NEEDS_APPROVAL)
    )
    assert final(engine, ref)["state"] == "awaiting_approval"
    (request,) = approvals_of(engine, op)
    proc = callgate(
        "approvals",
        "deny",
        str(request["approval_id"]),
        "--by",
        "bob",
        "--tenant",
        "tenant-a",
        env=producer_env(producer),
    )
    assert proc.returncode == 0, proc.stderr
    (result,) = producer.collect(turn_id, timeout=10).results
    assert result.status == "failed_terminal" and result.error.code == "approval_denied"
    # The same intent proposed again is denied without a new request or a handler run.
    _, ref2, _, _ = submit_one(
        producer, SUPPORT_A, "refund_payment", refund(order, NEEDS_APPROVAL), op
    )
    assert final(engine, ref2)["result"]["error"]["code"] == "approval_denied"
    assert len(approvals_of(engine, op)) == 1 and requests_for(engine, key) == 0


# --- concurrency: the business check and the write are not a read-then-write race -----------


def test_racing_refunds_never_exceed_the_payment(producer, stack, engine):
    stack(workers=4)
    order, payment = new_order(engine, "tenant-a", amount=10_000)
    with ThreadPoolExecutor(max_workers=8) as pool:
        turns = list(
            pool.map(
                lambda i: submit_one(
                    producer,
                    {**SUPPORT_A, "request_id": f"race-{i}"},
                    "refund_payment",
                    refund(order, 1_000),
                ),
                range(20),
            )
        )
    outcomes = []
    for turn_id, _, _, _ in turns:
        (result,) = producer.collect(turn_id, timeout=30).results
        outcomes.append(result.status if result.status == "succeeded" else result.error.code)
    refunded = scalar(
        engine, "SELECT refunded FROM downstream.payments WHERE payment_id = :p", p=payment
    )
    total = scalar(
        engine,
        "SELECT coalesce(sum(amount), 0) FROM downstream.refunds WHERE payment_id = :p",
        p=payment,
    )
    assert refunded == total == 10_000
    assert outcomes.count("succeeded") == 10
    assert outcomes.count("refund_amount_exceeded") == 10


def test_takeover_after_a_crash_keeps_the_admitted_payment(producer, stack, engine):
    """Crash gap, and meanwhile the order gets a newer payment: the new owner still refunds
    the payment the intent was admitted for, with the same key (replayed), not the newer one
    and not an idempotency_conflict."""
    s = stack(
        workers=1,
        CALLGATE_DEMO_DELAY_MS="refund_payment=0:2000",
        CALLGATE_LEASE_SECONDS="1",
        CALLGATE_SWEEP_SECONDS="0.2",
    )
    order, first_payment = new_order(engine, "tenant-a", amount=20_000)
    turn_id, ref, op, key = submit_one(producer, SUPPORT_A, "refund_payment", refund(order, 5_000))
    wait_until(lambda: effects_for(engine, key), what="the refund to reach the provider")
    owner = scalar(
        engine, "SELECT owner_token FROM callgate.operations WHERE operation_id = :o", o=op
    )
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    with engine.begin() as conn:
        downstream.add_payment(conn, order, "tenant-a", "m", f"pay-late-{op[-6:]}", 9_000, "KRW")
    s.start_worker("worker-2")
    (result,) = producer.collect(turn_id, timeout=20).results
    assert result.status == "succeeded"
    assert result.data["content"]["payment_id"] == first_payment
    assert result.data["content"]["replayed"] is True
    assert (requests_for(engine, key), effects_for(engine, key)) == (2, 1)
    assert trace_events(engine, ref, "takeover")
    # The owner token of generation 1 was live a moment ago; the trace never holds it.
    shown = callgate("trace", turn_id, "--json", env=producer_env(producer)).stdout
    assert owner is not None and str(owner) not in shown and "takeover" in shown
