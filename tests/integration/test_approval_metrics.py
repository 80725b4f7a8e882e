"""callgate_approvals_total counts what the approval statements did, in the process that
ran them: requested, superseded, granted, denied; a refused decision counts nothing."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from callgate.core.errors import ApprovalError
from callgate.store import approvals
from tests.integration.test_approvals_four_eyes import _parked

pytestmark = pytest.mark.services


def count(outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "callgate_approvals_total", {"tool": "refund_payment", "outcome": outcome}
    )
    return value or 0.0


def test_each_decision_is_counted_once(engine: Engine) -> None:
    before = {o: count(o) for o in ("requested", "superseded", "granted", "denied")}
    granted, _ = _parked(engine)
    denied, _ = _parked(engine)
    assert count("requested") == before["requested"] + 2

    approvals.approve(engine, granted, by="user-5", tenant="tenant-a")
    approvals.deny(engine, denied, by="user-5", tenant="tenant-a")
    with pytest.raises(ApprovalError):  # not pending any more: nothing is counted
        approvals.approve(engine, granted, by="user-5", tenant="tenant-a")
    with pytest.raises(ApprovalError):  # the requester cannot decide
        approvals.deny(engine, _parked(engine)[0], by="user-17", tenant="tenant-a")
    assert count("granted") == before["granted"] + 1
    assert count("denied") == before["denied"] + 1
    assert count("requested") == before["requested"] + 3
    assert count("superseded") == before["superseded"]


def test_a_new_intent_supersedes_the_pending_request(engine: Engine) -> None:
    approval, ref = _parked(engine)
    before = count("superseded"), count("requested")
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT operation_id, turn_id FROM callgate.calls WHERE id = :r"), {"r": ref}
        ).one()
    approvals.settle(
        engine,
        operation_id=row.operation_id,
        call_ref=uuid.uuid4(),  # another delivery, another intent
        turn_id=row.turn_id,
        tool_name="refund_payment",
        tenant_id="tenant-a",
        requested_by="user-17",
        intent_hash=f"other-{uuid.uuid4().hex}",
        policy_version="1",
        impact={"amount": 2},
    )
    assert (count("superseded"), count("requested")) == (before[0] + 1, before[1] + 1)
    assert approval
