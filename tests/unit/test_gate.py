"""The gate's pure steps (tools/gate.py) against the demo registry: allowlist, parse, schema."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.core.errors import ErrorCode, ToolError
from callgate.ops.lab.demo.tools import READS, WRITES, demo_registry
from callgate.tools import gate
from callgate.tools.registry import Registry

ALL_TOOLS = {
    "get_weather",
    "get_stock",
    "get_news",
    "read_email",
    "refund_payment",
    "send_email",
    "delete_emails",
}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return demo_registry()


def test_demo_registry_has_the_contract_tools(registry: Registry) -> None:
    assert set(registry.tools) == ALL_TOOLS
    assert {t for t in ALL_TOOLS if registry.tools[t].kind == "read"} == set(READS)
    assert {t for t in ALL_TOOLS if registry.tools[t].kind == "write"} == set(WRITES)


# --- allowlist -------------------------------------------------------------------------


def test_unknown_tool_is_rejected(registry: Registry) -> None:
    with pytest.raises(ToolError) as info:
        gate.check_allowed(registry, "drop_tables", ["support"])
    assert info.value.code == ErrorCode.UNKNOWN_TOOL
    assert info.value.code == "unknown_tool"


def test_unknown_tool_is_reported_before_the_role_check(registry: Registry) -> None:
    with pytest.raises(ToolError) as info:
        gate.check_allowed(registry, "drop_tables", [])
    assert info.value.code == ErrorCode.UNKNOWN_TOOL


def test_viewer_may_not_refund(registry: Registry) -> None:
    with pytest.raises(ToolError) as info:
        gate.check_allowed(registry, "refund_payment", ["viewer"])
    assert info.value.code == ErrorCode.TOOL_NOT_ALLOWED


def test_viewer_may_read_weather(registry: Registry) -> None:
    tool = gate.check_allowed(registry, "get_weather", ["viewer"])
    assert tool.name == "get_weather"
    assert tool.kind == "read"


@pytest.mark.parametrize("tool_name", sorted(ALL_TOOLS))
def test_support_may_call_every_tool(registry: Registry, tool_name: str) -> None:
    assert gate.check_allowed(registry, tool_name, ("support",)).name == tool_name


def test_no_roles_allows_nothing(registry: Registry) -> None:
    with pytest.raises(ToolError) as info:
        gate.check_allowed(registry, "get_weather", [])
    assert info.value.code == ErrorCode.TOOL_NOT_ALLOWED


def test_unknown_role_adds_nothing(registry: Registry) -> None:
    assert registry.allowed_for(["viewer", "admin"]) == frozenset(READS)
    with pytest.raises(ToolError) as info:
        gate.check_allowed(registry, "send_email", ["viewer", "admin"])
    assert info.value.code == ErrorCode.TOOL_NOT_ALLOWED


# --- parse_arguments -------------------------------------------------------------------


def test_parse_arguments_accepts_a_json_object_string() -> None:
    assert gate.parse_arguments('{"city": "Seoul", "unit": "celsius"}') == {
        "city": "Seoul",
        "unit": "celsius",
    }


def test_parse_arguments_accepts_a_mapping() -> None:
    assert gate.parse_arguments({"topic": "rust"}) == {"topic": "rust"}


@pytest.mark.parametrize("raw", ["{city: Seoul}", "", "{", "not json at all"])
def test_parse_arguments_rejects_invalid_json(raw: str) -> None:
    with pytest.raises(ToolError) as info:
        gate.parse_arguments(raw)
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS_JSON


@pytest.mark.parametrize("raw", ['["Seoul", "celsius"]', "42", '"text"', "null"])
def test_parse_arguments_requires_an_object(raw: str) -> None:
    with pytest.raises(ToolError) as info:
        gate.parse_arguments(raw)
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS
    assert info.value.details == [{"path": "", "code": "type", "expected": "object"}]


# --- validate_arguments ----------------------------------------------------------------


def _invalid(registry: Registry, tool_name: str, arguments: dict[str, Any]) -> ToolError:
    with pytest.raises(ToolError) as info:
        gate.validate_arguments(registry.require(tool_name), arguments)
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS
    return info.value


def test_valid_refund_arguments_pass(registry: Registry) -> None:
    args = gate.validate_arguments(
        registry.require("refund_payment"),
        {"order_id": "A-100", "amount": 10000, "currency": "KRW"},
    )
    assert args.model_dump() == {"order_id": "A-100", "amount": 10000, "currency": "KRW"}


def test_string_amount_is_rejected_without_echoing_the_value(registry: Registry) -> None:
    err = _invalid(
        registry, "refund_payment", {"order_id": "A-100", "amount": "10000", "currency": "KRW"}
    )
    assert err.details == [{"path": "/amount", "code": "int_type", "expected": "integer"}]
    assert "10000" not in str(err.details)
    assert "10000" not in str(err)


def test_missing_field_names_its_path(registry: Registry) -> None:
    err = _invalid(registry, "refund_payment", {"order_id": "A-100", "amount": 10})
    assert err.details == [{"path": "/currency", "code": "missing", "expected": "a value"}]


def test_extra_field_is_rejected(registry: Registry) -> None:
    err = _invalid(
        registry,
        "refund_payment",
        {"order_id": "A-100", "amount": 10, "currency": "KRW", "force": True},
    )
    assert err.details == [
        {"path": "/force", "code": "extra_forbidden", "expected": "no such field"}
    ]


def test_weather_unit_outside_the_enum(registry: Registry) -> None:
    err = _invalid(registry, "get_weather", {"city": "Seoul", "unit": "kelvin"})
    assert len(err.details) == 1
    detail = err.details[0]
    assert detail["path"] == "/unit"
    assert detail["code"] == "literal_error"
    assert "celsius" in detail["expected"] and "fahrenheit" in detail["expected"]
    assert "kelvin" not in str(err.details)


def test_every_error_is_reported_each_with_a_path(registry: Registry) -> None:
    err = _invalid(registry, "refund_payment", {"amount": 0, "currency": "GBP"})
    assert sorted(d["path"] for d in err.details) == ["/amount", "/currency", "/order_id"]
    assert all(set(d) == {"path", "code", "expected"} for d in err.details)
    assert "GBP" not in str(err.details)


# --- json_pointer ----------------------------------------------------------------------


def test_json_pointer_escapes_tilde_and_slash() -> None:
    assert gate.json_pointer(["a/b", "c~d", 0]) == "/a~1b/c~0d/0"
    # "~1" in a key must not be read back as "/": escape "~" first.
    assert gate.json_pointer(["~1"]) == "/~01"


def test_json_pointer_of_root_is_empty() -> None:
    assert gate.json_pointer([]) == ""


def test_an_approver_is_told_whether_the_write_can_be_undone() -> None:
    """The impact an approver reads says reversible or not: the tool's declared effect when
    its risk policy does not say; the policy's own word when it does."""
    from callgate.tools.gate import assess_risk
    from callgate.tools.registry import Facts, Principal, SideEffect, Tool

    schema = {"type": "object", "properties": {}, "additionalProperties": False}

    def tool(reversible: bool, impact: dict[str, Any] | None) -> Tool:
        return Tool(
            "archive",
            "Archive a thread.",
            schema,
            "write",
            lambda args, ctx: {},
            effect=SideEffect(idempotent=True, reversible=reversible),
            risk=lambda args, facts, who: impact,
        )

    who = Principal("t", "u", ("support",))
    facts = Facts(canonical={})
    assert assess_risk(tool(True, {"threads": 3}), {}, facts, who) == {
        "threads": 3,
        "reversible": True,
    }
    assert assess_risk(tool(False, {"threads": 3}), {}, facts, who)["reversible"] is False
    stated = {"threads": 3, "reversible": False}
    assert assess_risk(tool(True, stated), {}, facts, who) == stated
    assert assess_risk(tool(True, None), {}, facts, who) is None
