"""The pure decisions behind the hot path's counts, the handler's side-effect report, and the
one log record per state change (ids and bounded facts, never arguments)."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from callgate.core import logs
from callgate.observe import metrics
from callgate.store.calls import CallRecord
from callgate.tools.registry import ExecutionContext
from callgate.worker import events
from callgate.worker.events import DeliveryOutcome


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_refusal_is_labelled_by_the_layer_whose_verdict_is_its_code() -> None:
    verdicts = {"allowlist": "pass", "parse": "pass", "schema": "invalid_arguments"}
    assert metrics.refusal_layer(verdicts, "invalid_arguments") == "schema"
    assert metrics.refusal_layer({"business": "not_found"}, "not_found") == "business"
    approval = {"business": "pass", "authorization": "pass", "approval": "approval_denied"}
    assert metrics.refusal_layer(approval, "approval_denied") == "approval"
    conflict = {"allowlist": "pass", "idempotency": "idempotency_conflict"}
    assert metrics.refusal_layer(conflict, "idempotency_conflict") == "idempotency"
    # A refusal no layer decided (a bug on the gate's path), or a key that is not a layer.
    assert metrics.refusal_layer({"allowlist": "pass"}, "execution_failed") == "internal"
    assert metrics.refusal_layer({"lookup": "x"}, "x") == "internal"


@pytest.mark.parametrize(
    ("kind", "status", "code", "counts"),
    [
        ("write", "succeeded", None, True),
        ("write", "failed_terminal", "reconciliation_pending", True),  # may have applied
        ("write", "failed_terminal", "insufficient_funds", False),  # the downstream refused
        ("write", "failed_retryable", "upstream_unavailable", False),  # the operation stays open
        ("read", "succeeded", None, False),
    ],
)
def test_which_endings_count_as_a_write_operation(
    kind: str, status: str, code: str | None, counts: bool
) -> None:
    assert metrics.counts_as_write_operation(kind, status, code) is counts


def test_a_write_that_reports_nothing_counts_one_side_effect_per_successful_run() -> None:
    assert metrics.side_effects_on_return("write", []) == 1
    assert metrics.side_effects_on_return("write", [False]) == 0  # a replay
    assert metrics.side_effects_on_return("write", [True]) == 0  # counted when reported
    assert metrics.side_effects_on_return("read", []) == 0


def test_report_effect_counts_a_new_effect_at_once_and_a_replay_never() -> None:
    metrics.declare_tools([("t_effect", "write"), ("t_effect_read", "read")])
    before = sample("callgate_side_effects_total", tool="t_effect")
    ctx = ExecutionContext(
        tenant_id="t",
        user_id="u",
        operation_id="op",
        idempotency_key="k",
        fencing_token=1,
        request_id="r",
        on_effect=metrics.effect_reporter("t_effect", "write"),
    )
    ctx.report_effect(applied=True)
    assert sample("callgate_side_effects_total", tool="t_effect") == before + 1
    ctx.report_effect(applied=False)
    assert sample("callgate_side_effects_total", tool="t_effect") == before + 1
    assert ctx.effects == [True, False]
    # Having reported, the handler's return adds nothing.
    metrics.side_effects_returned("t_effect", "write", ctx.effects)
    assert sample("callgate_side_effects_total", tool="t_effect") == before + 1
    # A read's report is no side effect.
    metrics.effect_reporter("t_effect_read", "read")(True)
    assert sample("callgate_side_effects_total", tool="t_effect_read") == 0


def test_a_context_without_a_worker_accepts_reports() -> None:
    ctx = ExecutionContext("t", "u", "op", "k", 1, "r")
    ctx.report_effect(applied=True)
    assert ctx.effects == [True]
    assert "effects" not in repr(ctx)


CALL = CallRecord(
    ref=uuid.UUID(int=1),
    turn_id=uuid.UUID(int=2),
    call_id="call-7",
    tool_name="refund_payment",
    arguments={"card": "4111 1111 1111 1111", "password": "hunter2"},
    kind="write",
    state="proposed",
    operation_id="op-9",
    after_call=None,
    after_state=None,
    request_id="req",
    tenant_id="tenant-a",
    user_id="user-17",
    roles=("support",),
    op_state="pending",
    op_intent=None,
    op_canonical=None,
)


@pytest.fixture
def records() -> Iterator[io.StringIO]:
    """JSON log lines of the worker's logger at INFO."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JSONFormatter())
    logger = logging.getLogger("callgate.worker")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old_level)
    logger.propagate = old_propagate


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_each_state_change_is_one_record_with_the_ids_and_never_the_arguments(
    records: io.StringIO,
) -> None:
    metrics.declare_tools([("refund_payment", "write")])
    taken = sample("callgate_lease_takeovers_total", tool="refund_payment")
    ops = sample("callgate_write_operations_total", tool="refund_payment")
    events.reserved(CALL, "refund_payment", 2, True, since=0.0)
    events.completed(CALL, "refund_payment", "succeeded", None, 1, 2)
    events.completed(CALL, "refund_payment", "failed_terminal", "reconciliation_pending", 1, 3)
    events.rejected_stale(CALL, "refund_payment", DeliveryOutcome.STALE_FENCE, 1)
    events.refused(
        CALL,
        "refund_payment",
        verdicts={"allowlist": "pass", "business": "not_found"},
        status="failed_terminal",
        code="not_found",
        count=1,
        since=0.0,
    )
    events.reused(CALL, "refund_payment", 0)  # nothing ended: no record

    got = lines(records)
    assert [r["event"] for r in got] == [
        "taken_over",
        "completed",
        "reconciliation_pending",
        "rejected_stale",
        "refused",
    ]
    for r in got:
        assert (r["turn_id"], r["call_id"], r["call_ref"], r["operation_id"]) == (
            str(CALL.turn_id),
            "call-7",
            str(CALL.ref),
            "op-9",
        )
        assert r["tool"] == "refund_payment"
    assert got[2]["level"] == "warning"
    assert got[4]["layer"] == "business"
    text = records.getvalue()
    assert "4111" not in text and "hunter2" not in text and "card" not in text
    assert sample("callgate_lease_takeovers_total", tool="refund_payment") == taken + 1
    # The success and the reconciliation_pending ending each ended one write operation.
    assert sample("callgate_write_operations_total", tool="refund_payment") == ops + 2
    assert sample("callgate_gate_refusals_total", layer="business", code="not_found") >= 1


def test_a_delivery_that_changed_nothing_counts_as_a_duplicate() -> None:
    before = sample("callgate_duplicate_deliveries_total", tool="refund_payment")
    duplicate, succeeded = DeliveryOutcome.DUPLICATE_DELIVERY, DeliveryOutcome.SUCCEEDED
    assert events.delivered(CALL, "refund_payment", duplicate) == "duplicate_delivery"
    assert events.delivered(CALL, "refund_payment", succeeded) == "succeeded"
    assert sample("callgate_duplicate_deliveries_total", tool="refund_payment") == before + 1


def test_state_change_records_cost_nothing_below_their_level() -> None:
    logger = logging.getLogger("callgate.test.quiet")
    logger.setLevel(logging.WARNING)
    stream = io.StringIO()
    logger.addHandler(logging.StreamHandler(stream))
    logs.event(logger, "published", turn_id="t")
    logs.event(logger, "delivery_exhausted", logging.WARNING, call_ref="c", code=None)
    assert stream.getvalue().splitlines() == ["delivery exhausted"]


def test_proposed_calls_are_labelled_by_registered_tool_only() -> None:
    known = sample("callgate_calls_proposed_total", tool="get_weather")
    unknown = sample("callgate_calls_proposed_total", tool=metrics.UNREGISTERED_TOOL)
    metrics.calls_proposed_all(["get_weather", "rm -rf /", "get_weather"], {"get_weather"})
    assert sample("callgate_calls_proposed_total", tool="get_weather") == known + 2
    assert sample("callgate_calls_proposed_total", tool=metrics.UNREGISTERED_TOOL) == unknown + 1
