"""Scheduling a turn (producer/planning.py): reads free, writes chained in proposal order."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.core.errors import ErrorCode, InputError
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.tools.intent import idempotency_key
from callgate.tools.registry import Registry

CONTEXT = CallContext(
    request_id="req-1", tenant_id="tenant-a", user_id="user-17", roles=("support",)
)

REFUND = {"order_id": "A-100", "amount": 10, "currency": "KRW"}
EMAIL = {"to": "a@example.com", "template": "refund_done"}
WEATHER = {"city": "Seoul", "unit": "celsius"}
STOCK = {"symbol": "ACME"}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return demo_registry()


def call(call_id: str, tool_name: str, arguments: dict[str, Any]) -> ProposedCall:
    return ProposedCall(call_id=call_id, tool_name=tool_name, arguments=arguments)


def mixed_turn() -> list[ProposedCall]:
    # read, write, read, write, write, read
    return [
        call("c1", "get_weather", WEATHER),
        call("c2", "refund_payment", REFUND),
        call("c3", "get_stock", STOCK),
        call("c4", "send_email", EMAIL),
        call("c5", "refund_payment", {**REFUND, "amount": 20}),
        call("c6", "get_news", {"topic": "rates"}),
    ]


def test_plan_keeps_proposal_order_and_kinds(registry: Registry) -> None:
    planned = plan(mixed_turn(), CONTEXT, registry)
    assert [p.proposal.call_id for p in planned] == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert [p.kind for p in planned] == ["read", "write", "read", "write", "write", "read"]
    assert len({p.ref for p in planned}) == 6


def test_reads_have_no_predecessor(registry: Registry) -> None:
    planned = plan(mixed_turn(), CONTEXT, registry)
    reads = [p for p in planned if p.kind == "read"]
    assert [p.proposal.call_id for p in reads] == ["c1", "c3", "c6"]
    assert all(p.after is None for p in reads)


def test_writes_chain_in_proposal_order_across_reads(registry: Registry) -> None:
    by_id = {p.proposal.call_id: p for p in plan(mixed_turn(), CONTEXT, registry)}
    assert by_id["c2"].after is None
    assert by_id["c4"].after == by_id["c2"].ref
    assert by_id["c5"].after == by_id["c4"].ref


def test_dispatch_now_for_reads_and_the_first_write_only(registry: Registry) -> None:
    planned = plan(mixed_turn(), CONTEXT, registry)
    assert {p.proposal.call_id: p.dispatch_now for p in planned} == {
        "c1": True,
        "c2": True,
        "c3": True,
        "c4": False,
        "c5": False,
        "c6": True,
    }


def test_unknown_tool_is_planned_as_a_read(registry: Registry) -> None:
    planned = plan(
        [call("w", "refund_payment", REFUND), call("x", "no_such_tool", {})], CONTEXT, registry
    )
    assert planned[1].kind == "read"
    assert planned[1].after is None
    assert planned[1].dispatch_now


def test_duplicate_call_ids_are_rejected(registry: Registry) -> None:
    proposals = [call("c1", "get_weather", WEATHER), call("c1", "get_stock", STOCK)]
    with pytest.raises(InputError) as info:
        plan(proposals, CONTEXT, registry)
    assert info.value.code == ErrorCode.INVALID_INPUT
    assert "c1" in info.value.message


def test_empty_turn_is_rejected(registry: Registry) -> None:
    with pytest.raises(InputError) as info:
        plan([], CONTEXT, registry)
    assert info.value.code == ErrorCode.INVALID_INPUT


def test_given_operation_ids_are_reused_with_their_keys(registry: Registry) -> None:
    given = {"c2": "op-refund-A-100", "c4": "op-mail-A-100"}
    by_id = {p.proposal.call_id: p for p in plan(mixed_turn(), CONTEXT, registry, given)}
    assert by_id["c2"].operation_id == "op-refund-A-100"
    assert by_id["c4"].operation_id == "op-mail-A-100"
    assert by_id["c2"].idempotency_key == idempotency_key(
        "tenant-a", "refund_payment", "op-refund-A-100"
    )
    assert by_id["c4"].idempotency_key == idempotency_key("tenant-a", "send_email", "op-mail-A-100")


def test_generated_operation_ids_are_fresh_and_keyed(registry: Registry) -> None:
    first = plan(mixed_turn(), CONTEXT, registry)
    second = plan(mixed_turn(), CONTEXT, registry)
    ops = [p.operation_id for p in first]
    assert len(set(ops)) == len(ops)
    assert not set(ops) & {p.operation_id for p in second}
    for p in first:
        assert p.operation_id.startswith("op-")
        assert p.idempotency_key == idempotency_key(
            "tenant-a", p.proposal.tool_name, p.operation_id
        )


def test_key_depends_on_tenant(registry: Registry) -> None:
    other = CallContext(request_id="req-2", tenant_id="tenant-b", user_id="user-42")
    given = {"c2": "op-shared"}
    a = {p.proposal.call_id: p for p in plan(mixed_turn(), CONTEXT, registry, given)}
    b = {p.proposal.call_id: p for p in plan(mixed_turn(), other, registry, given)}
    assert a["c2"].operation_id == b["c2"].operation_id == "op-shared"
    assert a["c2"].idempotency_key != b["c2"].idempotency_key


def test_operation_ids_for_unknown_calls_are_rejected(registry: Registry) -> None:
    with pytest.raises(InputError) as info:
        plan(mixed_turn(), CONTEXT, registry, {"c2": "op-1", "c99": "op-2"})
    assert info.value.code == ErrorCode.INVALID_INPUT
    assert "c99" in info.value.message


def test_empty_operation_id_is_bad_input() -> None:
    from callgate.core.errors import InputError
    from callgate.core.types import CallContext, ProposedCall
    from callgate.ops.lab.demo.tools import demo_registry
    from callgate.producer.planning import plan

    ctx = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
    call = ProposedCall(call_id="c1", tool_name="send_email", arguments={})
    with pytest.raises(InputError):
        plan([call], ctx, demo_registry(), {"c1": ""})
