"""Idempotency keys and intent hashes (callgate/tools/intent.py): deterministic, order-blind."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.tools.intent import canonical_json, idempotency_key, intent_hash

BASE: dict[str, Any] = {
    "arguments": {"order_id": "A-100", "amount": 5000, "currency": "KRW"},
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "tool_name": "refund_payment",
    "tool_version": "1",
    "schema_version": "1",
    "resource": {"order_id": "A-100"},
}


def _hash(**overrides: Any) -> str:
    return intent_hash(**{**BASE, **overrides})


# --- idempotency_key -------------------------------------------------------------------


def test_idempotency_key_is_deterministic_sha256_hex() -> None:
    first = idempotency_key("tenant-a", "refund_payment", "op-1")
    second = idempotency_key("tenant-a", "refund_payment", "op-1")
    assert first == second
    assert len(first) == 64
    assert int(first, 16) >= 0  # hex digest


@pytest.mark.parametrize(
    ("tenant", "tool", "op"),
    [
        ("tenant-b", "refund_payment", "op-1"),
        ("tenant-a", "send_email", "op-1"),
        ("tenant-a", "refund_payment", "op-2"),
    ],
)
def test_idempotency_key_differs_when_any_part_differs(tenant: str, tool: str, op: str) -> None:
    assert idempotency_key(tenant, tool, op) != idempotency_key(
        "tenant-a", "refund_payment", "op-1"
    )


def test_idempotency_key_parts_cannot_be_shifted_across_the_separator() -> None:
    assert idempotency_key("t:send_email", "refund_payment", "x") != idempotency_key(
        "t", "send_email", "refund_payment:x"
    )


# --- intent_hash -----------------------------------------------------------------------


def test_intent_hash_is_deterministic() -> None:
    assert _hash() == _hash()
    assert len(_hash()) == 64


def test_intent_hash_ignores_argument_key_order() -> None:
    reordered = {"currency": "KRW", "amount": 5000, "order_id": "A-100"}
    assert list(reordered) != list(BASE["arguments"])
    assert _hash(arguments=reordered) == _hash()


def test_intent_hash_ignores_nested_key_order_and_construction() -> None:
    nested_a = {"outer": {"x": 1, "y": {"p": [1, 2], "q": "z"}}, "k": "v"}
    nested_b: dict[str, Any] = {}
    nested_b["k"] = "v"
    inner_y: dict[str, Any] = dict([("q", "z"), ("p", [1, 2])])
    nested_b["outer"] = dict(y=inner_y, x=1)
    assert nested_a == nested_b
    assert _hash(arguments=nested_a) == _hash(arguments=nested_b)
    # resource is order-blind too
    assert _hash(resource={"b": 2, "a": 1}) == _hash(resource={"a": 1, "b": 2})


def test_intent_hash_keeps_list_order() -> None:
    assert _hash(arguments={"items": [1, 2]}) != _hash(arguments={"items": [2, 1]})


@pytest.mark.parametrize(
    "overrides",
    [
        {"arguments": {"order_id": "A-100", "amount": 5001, "currency": "KRW"}},
        {"arguments": {"order_id": "A-101", "amount": 5000, "currency": "KRW"}},
        {"arguments": {"order_id": "A-100", "amount": 5000}},
        {"arguments": {"order_id": "A-100", "amount": 5000, "currency": "KRW", "note": "x"}},
        {"tenant_id": "tenant-b"},
        {"user_id": "user-42"},
        {"tool_name": "send_email"},
        {"tool_version": "2"},
        {"schema_version": "2"},
        {"resource": {"order_id": "A-999"}},
        {"resource": None},
        {"scope": "payments"},
    ],
    ids=lambda o: ",".join(o),
)
def test_intent_hash_changes_when_any_input_changes(overrides: dict[str, Any]) -> None:
    assert _hash(**overrides) != _hash()


def test_intent_hash_does_not_confuse_tenant_with_user() -> None:
    assert _hash(tenant_id="x", user_id="y") != _hash(tenant_id="y", user_id="x")


# --- canonical_json --------------------------------------------------------------------


def test_canonical_json_exact_spelling() -> None:
    value = {"b": [1, 2.5, None, True], "a": {"d": "é", "c": ""}}
    assert canonical_json(value) == '{"a":{"c":"","d":"é"},"b":[1,2.5,null,true]}'


def test_canonical_json_stable_across_key_order() -> None:
    assert canonical_json({"z": 1, "a": {"y": 2, "b": 3}}) == canonical_json(
        {"a": {"b": 3, "y": 2}, "z": 1}
    )
