"""Every approval decision is one INFO state-change record (docs/metrics.md, "Logs"), written
where the CLI and the API both decide: ``callgate.store.approvals``."""

from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import Engine

from callgate.core import logs
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import approvals, turns

A = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
REFUND = {"order_id": "O-secret-17", "amount": 1, "currency": "KRW"}


def _parked(engine: Engine, call_id: str) -> tuple[str, uuid.UUID]:
    (p,) = plan(
        [ProposedCall(call_id=call_id, tool_name="refund_payment", arguments=REFUND)],
        A,
        demo_registry(),
        None,
    )
    turn_id, _ = turns.record(engine, A, [p])
    settled = approvals.settle(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        tool_name="refund_payment",
        tenant_id="tenant-a",
        requested_by="user-17",
        intent_hash=f"intent-{uuid.uuid4().hex}",
        policy_version="1",
        impact={"amount": 1},
    )
    assert settled.parked and settled.approval_id is not None
    return str(settled.approval_id), turn_id


def test_each_decision_is_one_info_record(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    granted, granted_turn = _parked(engine, f"c-{uuid.uuid4().hex[:6]}")
    denied, denied_turn = _parked(engine, f"c-{uuid.uuid4().hex[:6]}")
    with caplog.at_level(logging.INFO, logger="callgate"):
        approvals.approve(engine, granted, by="alice", tenant="tenant-a")
        approvals.deny(engine, denied, by="bob", tenant="tenant-a")
    decisions = [
        logs.fields_of(r)
        for r in caplog.records
        if getattr(r, "event", None) in ("approval_granted", "approval_denied")
    ]
    assert [(d["event"], d["approval_id"]) for d in decisions] == [
        ("approval_granted", granted),
        ("approval_denied", denied),
    ]
    assert [
        r.levelno for r in caplog.records if getattr(r, "event", "").startswith("approval_")
    ] == [
        logging.INFO,
        logging.INFO,
    ]
    assert [d["principal_id"] for d in decisions] == ["alice", "bob"]
    assert [d["turn_id"] for d in decisions] == [str(granted_turn), str(denied_turn)]
    assert all(d["tool"] == "refund_payment" and d["count"] == 1 for d in decisions)
    assert all(d["call_id"].startswith("c-") and d["call_ref"] for d in decisions)
    shown = " ".join(str(d) for d in decisions) + " ".join(r.getMessage() for r in caplog.records)
    assert "O-secret-17" not in shown
