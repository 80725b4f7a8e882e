"""Four eyes and tenant scoping of approvals, against real Postgres (no workers).

The requester of an approval can never decide it, and an approver acts for one tenant: another
tenant's request is answered exactly like one that does not exist. Every assertion reads the
rows (the request, the parked call, its trace and outbox), never a returned boolean.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text

from callgate.core.errors import ApprovalError, ErrorCode
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import approvals, turns

A = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
REFUND = {"order_id": "O-17", "amount": 1, "currency": "KRW"}


def _parked(engine: Engine, requested_by: str = "user-17") -> tuple[str, uuid.UUID]:
    """A refund call of tenant-a parked on a fresh pending request; (approval id, call ref)."""
    ctx = A.model_copy(update={"user_id": requested_by})
    (p,) = plan(
        [ProposedCall(call_id="c1", tool_name="refund_payment", arguments=REFUND)],
        ctx,
        demo_registry(),
        None,
    )
    turn_id, _ = turns.record(engine, ctx, [p])
    settled = approvals.settle(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        tool_name="refund_payment",
        tenant_id="tenant-a",
        requested_by=requested_by,
        intent_hash=f"intent-{uuid.uuid4().hex}",
        policy_version="1",
        impact={"amount": 1},
    )
    assert settled.parked and settled.approval_id is not None
    return str(settled.approval_id), uuid.UUID(str(p.ref))


def _state(engine: Engine, approval_id: str, ref: uuid.UUID) -> dict[str, Any]:
    """What the database says: the request, the call, and what was written for it."""
    with engine.connect() as conn:
        request = conn.execute(
            text("SELECT state, decided_by FROM callgate.approvals WHERE approval_id = :a"),
            {"a": approval_id},
        ).one()
        call = conn.execute(
            text("SELECT state, dispatches FROM callgate.calls WHERE id = :r"), {"r": ref}
        ).one()
        events = [
            r.event
            for r in conn.execute(
                text("SELECT event FROM callgate.trace_events WHERE call_ref = :r ORDER BY id"),
                {"r": ref},
            )
        ]
        outbox = conn.execute(
            text("SELECT count(*) FROM callgate.outbox WHERE call_ref = :r"), {"r": ref}
        ).scalar_one()
    return {
        "request": (request.state, request.decided_by),
        "call": (call.state, call.dispatches),
        "events": events,
        "outbox": outbox,
    }


def test_the_requester_can_neither_approve_nor_deny_their_own_request(engine: Engine) -> None:
    approval_id, ref = _parked(engine)
    before = _state(engine, approval_id, ref)
    assert before["request"] == ("pending", None) and before["call"][0] == "awaiting_approval"

    # The same person, also spelled with other case and spaces: refused, nothing changes.
    for by in ("user-17", " USER-17 "):
        with pytest.raises(ApprovalError) as approving:
            approvals.approve(engine, approval_id, by=by, tenant="tenant-a")
        assert approving.value.code == ErrorCode.APPROVAL_FORBIDDEN
        assert "user-17" in approving.value.message
        with pytest.raises(ApprovalError) as denying:
            approvals.deny(engine, approval_id, by=by, tenant="tenant-a")
        assert denying.value.code == ErrorCode.APPROVAL_FORBIDDEN
        assert _state(engine, approval_id, ref) == before

    # Another person of the same tenant decides it: the call resumes, once.
    assert approvals.approve(engine, approval_id, by="alice", tenant="tenant-a") == [ref]
    after = _state(engine, approval_id, ref)
    assert after["request"] == ("approved", "alice")
    assert after["call"] == ("proposed", before["call"][1] + 1)
    assert after["events"] == [*before["events"], "approval_granted"]
    # Decided: the requester now hears that it is no longer pending, not a new refusal.
    with pytest.raises(ApprovalError) as late:
        approvals.approve(engine, approval_id, by="bob", tenant="tenant-a")
    assert late.value.code == ErrorCode.APPROVAL_NOT_PENDING


def test_a_deny_by_another_person_ends_the_call(engine: Engine) -> None:
    approval_id, ref = _parked(engine)
    finished = approvals.deny(engine, approval_id, by="alice", tenant="tenant-a")
    after = _state(engine, approval_id, ref)
    assert after["request"] == ("denied", "alice")
    assert after["call"][0] == "failed_terminal" and after["outbox"] == 1
    assert finished.finished == 1


def test_another_tenants_request_is_indistinguishable_from_a_missing_one(engine: Engine) -> None:
    approval_id, ref = _parked(engine)
    before = _state(engine, approval_id, ref)
    missing = str(uuid.uuid4())

    def refusal(call: Any, ident: str) -> tuple[ErrorCode, str]:
        with pytest.raises(ApprovalError) as info:
            call(ident)
        return info.value.code, info.value.message.replace(ident, "ID")

    for decide in (approvals.approve, approvals.deny):
        for tenant, by in (("tenant-b", "user-42"), ("tenant-b", "user-17")):

            def act(ident: str, decide: Any = decide, tenant: str = tenant, by: str = by) -> Any:
                return decide(engine, ident, by=by, tenant=tenant)

            theirs = refusal(act, approval_id)
            assert theirs == refusal(act, missing)
            assert theirs[0] == ErrorCode.UNKNOWN_APPROVAL
    shown = refusal(lambda i: approvals.show(engine, i, tenant="tenant-b"), approval_id)
    assert shown == refusal(lambda i: approvals.show(engine, i, tenant="tenant-b"), missing)
    listed = approvals.requests(engine, tenant="tenant-b", state=None)
    assert approval_id not in {a["approval_id"] for a in listed}
    assert approval_id in {a["approval_id"] for a in approvals.requests(engine, tenant="tenant-a")}
    assert approvals.show(engine, approval_id, tenant="tenant-a")["requested_by"] == "user-17"
    assert _state(engine, approval_id, ref) == before


def test_an_approver_must_name_themselves_and_their_tenant(engine: Engine) -> None:
    approval_id, ref = _parked(engine)
    before = _state(engine, approval_id, ref)
    for by, tenant in (("", "tenant-a"), ("alice", " ")):
        with pytest.raises(ApprovalError) as info:
            approvals.approve(engine, approval_id, by=by, tenant=tenant)
        assert info.value.code == ErrorCode.INVALID_INPUT
    assert _state(engine, approval_id, ref) == before


@pytest.mark.parametrize(
    ("requester", "decider"),
    [("ΣΑΣ", "σας"), ("Straße", "STRASSE"), ("user-17", " USER-17 ")],
)
def test_names_that_fold_to_one_person_cannot_decide_each_other(
    engine: Engine, requester: str, decider: str
) -> None:
    """One rule, Python's case folding, for the database's statement and LocalRunner alike: a
    collation whose lower() disagrees with Python (C.UTF-8 leaves 'Σ' and 'ß' alone) cannot
    let the requester decide under another spelling of their name."""
    approval_id, ref = _parked(engine, requested_by=requester)
    for decide in (approvals.approve, approvals.deny):
        with pytest.raises(ApprovalError) as refused:
            decide(engine, approval_id, by=decider, tenant="tenant-a")
        assert refused.value.code == ErrorCode.APPROVAL_FORBIDDEN
    assert _state(engine, approval_id, ref)["request"] == ("pending", None)

    approvals.approve(engine, approval_id, by="someone-else", tenant="tenant-a")
    assert _state(engine, approval_id, ref)["request"] == ("approved", "someone-else")


def test_local_runner_applies_the_same_rule() -> None:
    from callgate.tools.registry import Principal
    from callgate.worker.local import LocalRunner
    from tests.faults import tools

    runner = LocalRunner(tools.registry())
    who = Principal("tenant-a", "ΣΑΣ", ("support",))
    asks = {"note": "n", "needs_approval": True}
    refused = runner.call("fault_unkeyed", asks, principal=who, approved_by="σας")
    assert refused.status == "failed_terminal", refused
    assert refused.error.code == ErrorCode.APPROVAL_FORBIDDEN
    waits = runner.call("fault_unkeyed", asks, principal=who)
    assert waits.status == "awaiting_approval", waits
