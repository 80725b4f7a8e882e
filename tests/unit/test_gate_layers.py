"""Pure parts of the gate beyond the schema: JSON Schema checks, safe results, budgets,
allowlists from configuration. No services."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from callgate.core.errors import ConfigurationError, ErrorCode, ToolError
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.budgets import apply_budgets
from callgate.producer.planning import arguments_hash, plan
from callgate.store.turns import ConversationFacts
from callgate.tools import gate
from callgate.tools.registry import READ_ONLY, ResultLimits, Tool, from_env, load_allowlist
from callgate.tools.results import TRUST_LABEL, redact_text, safe_error, safe_result

DEMO = {"CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry"}

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
}


# --- check_arguments (JSON Schema, e.g. tools discovered over MCP) ------------------------


def test_valid_arguments_give_no_details() -> None:
    assert gate.check_arguments(WEATHER_SCHEMA, {"city": "Seoul", "unit": "celsius"}) == []


def test_details_name_path_rule_and_expectation_never_the_value() -> None:
    details = gate.check_arguments(
        WEATHER_SCHEMA, {"city": "서울-secret", "unit": "kelvin", "days": 30, "admin": True}
    )
    assert details == [
        {"path": "/admin", "code": "extra_forbidden", "expected": "no such field"},
        {"path": "/days", "code": "maximum", "expected": "<= 7"},
        {"path": "/unit", "code": "enum", "expected": 'one of "celsius", "fahrenheit"'},
    ]
    assert "kelvin" not in json.dumps(details) and "secret" not in json.dumps(details)


def test_missing_fields_are_reported_at_their_own_path() -> None:
    assert gate.check_arguments(WEATHER_SCHEMA, {}) == [
        {"path": "/city", "code": "missing", "expected": "a value"},
        {"path": "/unit", "code": "missing", "expected": "a value"},
    ]


def test_nested_paths_are_json_pointers() -> None:
    schema = {
        "type": "object",
        "properties": {"a/b": {"type": "array", "items": {"type": "integer"}}},
    }
    assert gate.check_arguments(schema, {"a/b": [1, "x"]}) == [
        {"path": "/a~1b/1", "code": "type", "expected": "integer"}
    ]


def test_an_invalid_schema_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        gate.check_arguments({"type": "no-such-type"}, {})


def test_a_json_schema_tool_is_validated_by_the_same_layer() -> None:
    tool = Tool("weather_mcp", "Weather over MCP.", WEATHER_SCHEMA, "read", lambda a, c: {})
    assert gate.validate_arguments(tool, {"city": "Seoul", "unit": "celsius"}) == {
        "city": "Seoul",
        "unit": "celsius",
    }
    with pytest.raises(ToolError) as info:
        gate.validate_arguments(tool, {"city": "Seoul"})
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS
    assert info.value.details == [{"path": "/unit", "code": "missing", "expected": "a value"}]
    assert tool.definition()["parameters"] == WEATHER_SCHEMA


# --- allowlists from configuration -----------------------------------------------------


def test_definitions_shown_are_the_allowlist_never_more() -> None:
    registry = demo_registry()
    assert [t["name"] for t in registry.definitions_for(["viewer"])] == [
        "get_news",
        "get_stock",
        "get_weather",
        "read_email",
    ]
    assert registry.definitions_for([]) == []
    assert registry.definitions_for(["no-such-role"]) == []


def test_the_scope_in_an_intent_is_the_roles_that_allow_the_tool() -> None:
    registry = demo_registry()
    assert registry.scope_of("refund_payment", ["viewer", "support"]) == "support"
    assert registry.scope_of("get_news", ["viewer", "support"]) == "support,viewer"
    assert registry.scope_of("refund_payment", ["viewer"]) == ""


def test_allowlist_from_inline_json_and_from_a_file(tmp_path: Path) -> None:
    inline = from_env({**DEMO, "CALLGATE_ALLOWLIST": '{"auditor": ["get_news"]}'})
    assert inline.allowed_for(["auditor"]) == {"get_news"}
    assert inline.allowed_for(["support"]) == frozenset()  # the file replaces the defaults
    path = tmp_path / "allow.json"
    path.write_text('{"ops": ["get_stock", "refund_payment"]}')
    assert from_env({**DEMO, "CALLGATE_ALLOWLIST": str(path)}).allowed_for(["ops"]) == {
        "get_stock",
        "refund_payment",
    }


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ('{"ops": ["drop_tables"]}', "unknown tools"),
        ('{"ops": "get_news"}', "must be a JSON object"),
        ("{not json", "not valid JSON"),
        ("/no/such/file.json", "cannot read file"),
        ('["get_news"]', "must be a JSON object"),
    ],
)
def test_bad_allowlists_are_clear_configuration_errors(value: str, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        from_env({**DEMO, "CALLGATE_ALLOWLIST": value})
    assert fragment in info.value.message


def test_load_allowlist_reads_roles() -> None:
    assert load_allowlist('{"a": [], "b": ["x"]}') == {"a": [], "b": ["x"]}


# --- safe results -------------------------------------------------------------------------


def _tool(**kw: Any) -> Tool:
    return Tool("t", "test tool", WEATHER_SCHEMA, "read", lambda a, c: {}, **kw)


def test_results_are_wrapped_with_source_and_trust_label() -> None:
    envelope, notes = safe_result(_tool(version="3"), {"temperature": 22})
    assert envelope == {
        "source": {"tool": "t", "version": "3"},
        "trust": TRUST_LABEL,
        "content": {"temperature": 22},
    }
    assert notes == []


def test_secrets_tokens_and_stack_traces_are_redacted() -> None:
    raw = {
        "password": "hunter2",
        "nested": {"api_key": "k", "note": "use token=abc123; then Bearer eyJhbGciOi.x.y"},
        "log": 'ok\nTraceback (most recent call last):\n  File "x.py", line 3, in f\nKeyError: 1',
        "aws": "AKIAABCDEFGHIJKLMNOP",
    }
    envelope, notes = safe_result(_tool(), raw)
    text = json.dumps(envelope)
    for secret in ("hunter2", "abc123", "eyJhbGciOi", "x.py", "AKIAABCDEFGHIJKLMNOP"):
        assert secret not in text
    assert envelope["content"]["nested"]["api_key"] == "[redacted]"
    assert envelope["content"]["log"] == "ok\n[stack trace redacted]"
    assert {"secret_redacted", "stack_trace_redacted"} <= set(notes)


def test_sizes_are_capped() -> None:
    limits = ResultLimits(max_string=10, max_items=3, max_depth=2)
    envelope, notes = safe_result(
        _tool(limits=limits), {"s": "x" * 50, "l": list(range(10)), "d": {"a": {"b": {"c": 1}}}}
    )
    content = envelope["content"]
    assert content["s"] == "x" * 10 + "…[truncated]"
    assert content["l"] == [0, 1, 2]
    assert content["d"] == {"a": {"b": "[truncated]"}}
    assert {"string_capped", "items_capped", "depth_capped"} <= set(notes)


def test_unknown_fields_are_dropped_by_the_result_schema() -> None:
    tool = demo_registry().tools["refund_payment"]
    envelope, _ = safe_result(
        tool,
        {
            "refund_id": "rf-1",
            "payment_id": "pay-1",
            "amount": 1,
            "currency": "KRW",
            "status": "completed",
            "replayed": False,
            "internal_ledger_row": 991,
            "resource_id": "pay-1",
        },
    )
    assert set(envelope["content"]) == {
        "refund_id",
        "payment_id",
        "amount",
        "currency",
        "status",
        "replayed",
    }


def test_a_result_that_breaks_its_schema_is_withheld_not_invented() -> None:
    tool = demo_registry().tools["refund_payment"]
    envelope, notes = safe_result(tool, {"refund_id": "rf-1"})
    assert envelope["content"] is None and notes == ["result_withheld"]


def test_errors_keep_only_safe_fixable_fields() -> None:
    error = safe_error(
        "invalid_arguments",
        [{"path": "/a", "code": "type", "expected": "integer", "value": "s3cret", "sql": "SELECT"}],
    )
    assert error == {
        "code": "invalid_arguments",
        "details": [{"code": "type", "path": "/a", "expected": "integer"}],
    }


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("access_token=abc123def", "abc123def"),
        ('refresh_token: "r-7788"', "r-7788"),
        ("client_secret=s3cr3t&x=1", "s3cr3t"),
        ('{"password": "hunter2"}', "hunter2"),
        ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("authorization=Bearer abc.def", "abc.def"),
        ('{"Authorization": "Token t0k"}', "t0k"),
        ("postgres://bob:pw123@db:5432/x", "pw123"),
        ("key ghp_abcdefghijklmnop1234", "ghp_abcdefghijklmnop1234"),
    ],
)
def test_common_secret_spellings_are_redacted(text: str, secret: str) -> None:
    notes: list[str] = []
    assert secret not in redact_text(text, 500, notes)
    assert notes == ["secret_redacted"]


def test_redact_text_leaves_plain_text_alone() -> None:
    for plain in ("22 celsius in Seoul", "the password is strong", "tokens are fine"):
        assert redact_text(plain, 100) == plain


# --- budgets and repeated calls -------------------------------------------------------------

CTX = CallContext(request_id="r", tenant_id="t", user_id="u", roles=("support",))


def _planned(*proposals: tuple[str, Any]) -> list[Any]:
    calls = [
        ProposedCall(call_id=f"c{i}", tool_name=tool, arguments=args)
        for i, (tool, args) in enumerate(proposals)
    ]
    return plan(calls, CTX, demo_registry())


def test_calls_beyond_the_turn_budget_are_refused() -> None:
    planned = _planned(*[("get_news", {"topic": str(i)}) for i in range(4)])
    out = apply_budgets(
        planned, ConversationFacts(0, frozenset()), turn_budget=2, conversation_budget=99
    )
    assert [p.refusal["code"] if p.refusal else None for p in out] == [
        None,
        None,
        "budget_exceeded",
        "budget_exceeded",
    ]


def test_the_conversation_budget_counts_earlier_turns() -> None:
    planned = _planned(("get_news", {"topic": "a"}), ("get_news", {"topic": "b"}))
    out = apply_budgets(
        planned, ConversationFacts(9, frozenset()), turn_budget=5, conversation_budget=10
    )
    assert [p.refusal is None for p in out] == [True, False]


def test_same_tool_same_arguments_after_a_terminal_error_is_a_repeated_call() -> None:
    args = {"symbol": "no way", "x": 1}
    failed = frozenset({("get_stock", arguments_hash(args))})
    planned = _planned(
        ("get_stock", {"x": 1, "symbol": "no way"}),  # key order does not matter
        ("get_stock", '{"symbol": "no way", "x": 1}'),  # nor does raw JSON spelling
        ("get_stock", {"symbol": "NVDA"}),
    )
    out = apply_budgets(
        planned, ConversationFacts(0, failed), turn_budget=9, conversation_budget=99
    )
    assert [p.refusal["code"] if p.refusal else None for p in out] == [
        "repeated_call",
        "repeated_call",
        None,
    ]


def test_a_refused_write_does_not_hold_back_the_next_write() -> None:
    refund = {"order_id": "O-1", "amount": 1, "currency": "KRW"}
    failed = frozenset({("refund_payment", arguments_hash(refund))})
    planned = _planned(("refund_payment", refund), ("send_email", {"to": "a@b", "template": "x"}))
    assert planned[1].after == planned[0].ref
    out = apply_budgets(
        planned, ConversationFacts(0, failed), turn_budget=9, conversation_budget=99
    )
    assert out[0].refusal is not None and not out[0].dispatch_now
    assert out[1].after is None and out[1].dispatch_now


def test_unparseable_arguments_hash_by_their_exact_text() -> None:
    assert arguments_hash('{"a":') == arguments_hash('{"a":')
    assert arguments_hash('{"a":') != arguments_hash('{"a": ')


def test_an_identical_write_twice_in_one_turn_runs_once_and_names_the_first() -> None:
    refund = {"order_id": "O-1", "amount": 1, "currency": "KRW"}
    planned = _planned(
        ("refund_payment", refund),
        ("get_stock", {"symbol": "NVDA"}),
        ("get_stock", {"symbol": "NVDA"}),  # identical reads both run
        ("refund_payment", {"currency": "KRW", "amount": 1, "order_id": "O-1"}),
        ("refund_payment", {**refund, "amount": 2}),  # another amount is another write
    )
    out = apply_budgets(
        planned, ConversationFacts(0, frozenset()), turn_budget=9, conversation_budget=99
    )
    assert [p.refusal["code"] if p.refusal else None for p in out] == [
        None,
        None,
        None,
        "repeated_call",
        None,
    ]
    (detail,) = out[3].refusal["details"]
    assert detail["code"] == "repeated_in_turn"
    assert planned[0].proposal.call_id in detail["expected"]
    # The refused repeat holds nothing back: the next write follows the first.
    assert out[4].after == out[0].ref


class _Loose(BaseModel):  # a hand-written model with pydantic's default: extra="ignore"
    city: str
    unit: str = Field("celsius", alias="temperatureUnit")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    city: str


def _loose_tool(arguments: type[BaseModel]) -> Tool:
    return Tool(
        name="loose",
        description="A hand-written arguments model.",
        arguments=arguments,
        kind="read",
        handler=lambda args, ctx: {},
        effect=READ_ONLY,
    )


def test_unknown_fields_are_refused_even_when_the_tools_model_would_ignore_them() -> None:
    tool = _loose_tool(_Loose)
    assert gate.validate_arguments(tool, {"city": "Seoul", "temperatureUnit": "kelvin"})
    with pytest.raises(ToolError) as refused:
        gate.validate_arguments(tool, {"city": "Seoul", "admin": True, "sudo": 1})
    assert refused.value.code == ErrorCode.INVALID_ARGUMENTS
    assert [d["path"] for d in refused.value.details] == ["/admin", "/sudo"]
    with pytest.raises(ToolError) as both:
        gate.validate_arguments(tool, {"admin": True})  # missing city, and an extra field
    assert {d["code"] for d in both.value.details} == {"missing", "extra_forbidden"}
    # A model that says it takes unknown fields gets them.
    assert gate.validate_arguments(_loose_tool(_Open), {"city": "Seoul", "x": 1})


def test_a_write_the_conversation_already_made_is_a_repeated_call_unless_meant() -> None:
    """A model that lost a refund's result proposes it again in the next turn, under a new
    call id: it ends repeated_call naming the earlier call, not a second refund. Under the
    earlier operation id it gets that result; the application's repeat=True runs it."""
    refund = {"order_id": "O-1", "amount": 1, "currency": "KRW"}
    done = {("refund_payment", arguments_hash(refund)): ("turn1-refund", "op-first")}
    facts = ConversationFacts(0, frozenset(), done)
    again = ProposedCall(call_id="turn2-refund", tool_name="refund_payment", arguments=refund)
    meant = again.model_copy(update={"call_id": "turn2-meant", "repeat": True})
    other = ProposedCall(
        call_id="turn2-other", tool_name="refund_payment", arguments={**refund, "amount": 2}
    )
    reads = ProposedCall(call_id="turn2-read", tool_name="get_stock", arguments={"symbol": "X"})
    out = apply_budgets(
        plan([again, meant, other, reads], CTX, demo_registry()),
        facts,
        turn_budget=9,
        conversation_budget=99,
    )
    codes = [(p.refusal["details"][0]["code"] if p.refusal else None) for p in out]
    assert codes == ["done_before", None, None, None]
    assert "turn1-refund" in out[0].refusal["details"][0]["expected"]
    same_operation = plan([again], CTX, demo_registry(), {"turn2-refund": "op-first"})
    (reused,) = apply_budgets(same_operation, facts, turn_budget=9, conversation_budget=99)
    assert reused.refusal is None
