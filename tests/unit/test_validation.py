"""Submit's checks (producer/validation.py, callgate/core/values.py) and the gate's strict parse,
without services. The same cases run against real Postgres in
tests/integration/test_submit_input.py; here the rules themselves are pinned down."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.core import values
from callgate.core.errors import ErrorCode, InputError, JSONValueError, ToolError
from callgate.core.settings import Settings
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import arguments_hash, plan
from callgate.producer.validation import (
    MAX_ID_LENGTH,
    MAX_ROLES,
    Limits,
    check_id,
    check_submission,
)
from callgate.tools import gate

LIMITS = Limits(max_call_bytes=1024, max_turn_calls=4)
CTX: dict[str, Any] = {"request_id": "r", "tenant_id": "t", "user_id": "u", "roles": ["support"]}
REFUND = {"order_id": "O-17", "amount": 1, "currency": "KRW"}


def one(arguments: Any, call_id: str = "c-1") -> list[dict[str, Any]]:
    return [{"call_id": call_id, "tool_name": "get_news", "arguments": arguments}]


def refused(proposals: Any, context: Any = CTX, ops: Any = None) -> InputError:
    with pytest.raises(InputError) as info:
        check_submission(proposals, context, ops, limits=LIMITS)
    return info.value


# --- callgate/core/values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"a": NaN}', "NaN"),
        ('{"a": Infinity}', "Infinity"),
        ('{"a": -Infinity}', "-Infinity"),
        ('{"a": 1e400}', "too large"),
        ('{"a": -1E+999}', "too large"),
        ('{"a": ' + "1" * 5000 + "}", "4096 bits"),
        ('{"a": 1, "a": 1}', "twice"),
        ('{"x": {"a": 1, "b": 2, "a": 3}}', "twice"),
        ('{"a": "\\u0000"}', "NUL"),
        ('{"\\u0000": 1}', "NUL"),
        ('{"a": "\\ud800"}', "surrogate"),
        ('{"a": "\\udc00x"}', "surrogate"),
        ("[" * 65 + "]" * 65, "deeper than 64"),
        ("[" * 5000 + "]" * 5000, "deeper than 64"),
    ],
)
def test_loads_refuses_what_json_or_postgres_cannot_hold(text: str, fragment: str) -> None:
    with pytest.raises(JSONValueError) as info:
        values.loads(text)
    assert fragment in info.value.message and not info.value.syntax


@pytest.mark.parametrize("text", ["", "{", "{a: 1}", '{"a": 1,}', "nope"])
def test_loads_marks_plain_syntax_errors(text: str) -> None:
    with pytest.raises(JSONValueError) as info:
        values.loads(text)
    assert info.value.syntax


def test_loads_keeps_what_is_fine() -> None:
    text = '{"a": [1, -2.5e10, "한국어 😀", null, true], "b": {"c": ' + "9" * 1000 + "}}"
    assert values.loads(text) == json.loads(text)
    assert values.loads("[" * 64 + "]" * 64) is not None


def test_check_depth_is_exactly_the_constant() -> None:
    value: Any = 1
    for _ in range(values.MAX_JSON_DEPTH):
        value = [value]
    values.check(value)
    with pytest.raises(JSONValueError):
        values.check([value])


@pytest.mark.parametrize(
    "value",
    [
        {"a": float("nan")},
        {"a": float("-inf")},
        {"a": 2**5000},
        {"a": (1, 2)},
        {"a": {1, 2}},
        {"a": b"x"},
        {1: "a"},
        {"a": "\x00"},
        {"\ud800": 1},
        {"a": [{"b": ["\udfff"]}]},
    ],
)
def test_check_refuses_values_that_are_not_storable_json(value: Any) -> None:
    with pytest.raises(JSONValueError):
        values.check(value)


def test_printable_escapes_and_cuts() -> None:
    assert values.printable("a\x00b\nc\ud800\u202e\\") == "a\\u0000b\\u000ac\\ud800\\u202e\\\\"
    assert values.printable("x" * 100, 10) == "x" * 10 + "..."
    assert values.printable("한국어 ok") == "한국어 ok"


# --- producer/validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["", " ", "\t", "a\x00", "a\nb", "a\ud800", "a\u202eb", "x" * (MAX_ID_LENGTH + 1), 7]
)
def test_check_id_refuses(value: Any) -> None:
    with pytest.raises(InputError) as info:
        check_id(value, "id")
    assert "\n" not in info.value.message


@pytest.mark.parametrize("value", ["c-1", "call_abc 1", "toolu_01A", "한국", "x" * MAX_ID_LENGTH])
def test_check_id_accepts(value: str) -> None:
    check_id(value, "id")


def test_turn_and_call_limits() -> None:
    assert "at most 4 calls" in refused(one({"topic": "a"}) * 5).message
    assert "CALLGATE_MAX_CALL_BYTES" in refused(one({"topic": "x" * 1100})).message
    assert "CALLGATE_MAX_CALL_BYTES" in refused(one('{"topic": "' + "é" * 600 + '"}')).message
    # Exactly at the limit is accepted: bytes of the compact UTF-8 serialisation.
    at_limit = {"topic": "x" * (1024 - len('{"topic":""}'))}
    check_submission(one(at_limit), CTX, None, limits=LIMITS)


def test_roles_are_capped() -> None:
    ctx = {**CTX, "roles": [f"r{i}" for i in range(MAX_ROLES + 1)]}
    assert "roles" in refused(one({"topic": "a"}), ctx).message
    check_submission(
        one({"topic": "a"}), {**ctx, "roles": ctx["roles"][:MAX_ROLES]}, None, limits=LIMITS
    )


def test_string_arguments_get_the_arguments_json_code_objects_invalid_input() -> None:
    assert refused(one('{"topic": "\\u0000"}')).code == ErrorCode.INVALID_ARGUMENTS_JSON
    assert refused(one({"topic": "\x00"})).code == ErrorCode.INVALID_INPUT


def test_plain_syntax_errors_in_string_arguments_are_left_to_the_gate() -> None:
    checked = check_submission(one('{"topic":'), CTX, None, limits=LIMITS)
    with pytest.raises(ToolError) as info:
        gate.parse_arguments(checked.calls[0].arguments)
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS_JSON


def test_operation_ids_are_checked() -> None:
    calls = [*one({"topic": "a"}), *one({"topic": "b"}, "c-2")]
    assert refused(calls, ops={"c-1": "o" * 10_000}).code == ErrorCode.INVALID_INPUT
    assert refused(calls, ops={"c-1": "op\x00"}).code == ErrorCode.INVALID_INPUT
    assert refused(calls, ops={"c-1": 5}).code == ErrorCode.INVALID_INPUT
    assert refused(calls, ops=["c-1"]).code == ErrorCode.INVALID_INPUT


def test_not_a_list_or_object() -> None:
    assert "list" in refused("abc").message
    assert "proposal 0" in refused([5]).message
    assert "context" in refused(one({"topic": "a"}), context=[1]).message


def test_limits_of_settings() -> None:
    s = Settings.from_env({"CALLGATE_MAX_CALL_BYTES": "4096", "CALLGATE_MAX_TURN_CALLS": "9"})
    assert Limits.of(s) == Limits(max_call_bytes=4096, max_turn_calls=9)
    assert Limits.of(Settings.from_env({})) == Limits(262_144, 128)


# --- planning: one operation id per turn (hole 12) -----------------------------------------


def test_plan_refuses_one_operation_id_for_two_calls() -> None:
    ctx = CallContext(**CTX)
    calls = [
        ProposedCall(call_id="c-1", tool_name="refund_payment", arguments=REFUND),
        ProposedCall(call_id="c-2", tool_name="refund_payment", arguments={**REFUND, "amount": 2}),
    ]
    with pytest.raises(InputError) as info:
        plan(calls, ctx, demo_registry(), {"c-1": "op-1", "c-2": "op-1"})
    assert "two calls of one turn" in info.value.message
    planned = plan(calls, ctx, demo_registry(), {"c-1": "op-1", "c-2": "op-2"})
    assert [p.operation_id for p in planned] == ["op-1", "op-2"]


def test_arguments_hash_never_raises_on_hostile_strings() -> None:
    for raw in ["[" * 100_000, '{"a": ' + "1" * 5000 + "}", '{"a": NaN}', "{"]:
        assert len(arguments_hash(raw)) == 64


# --- the gate parses as submit does ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    ['{"a": 1, "a": 2}', '{"a": NaN}', '{"a": 1e400}', '{"a": "\\u0000"}', "[" * 2000],
)
def test_the_gate_refuses_what_submit_refuses(raw: str) -> None:
    with pytest.raises(ToolError) as info:
        gate.parse_arguments(raw)
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS_JSON


# --- hole 15: the demo refund's order id ---------------------------------------------------


@pytest.mark.parametrize(
    "order_id", ["O-\x00", "O 17", "O-17'--", "\u202eO-17", "x" * 10_000, "Ｏ-17"]
)
def test_refund_order_id_is_bounded_by_its_schema(order_id: str) -> None:
    tool = demo_registry().require("refund_payment")
    with pytest.raises(ToolError) as info:
        gate.validate_arguments(tool, {**REFUND, "order_id": order_id})
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS
    assert [d["path"] for d in info.value.details] == ["/order_id"]
    assert not info.value.retryable


def test_a_lookup_the_database_refuses_is_invalid_arguments_not_upstream() -> None:
    from sqlalchemy.exc import DataError

    from callgate.ops.lab.demo.tools import DemoServices
    from callgate.tools.registry import Principal

    class Refusing:
        def lookup_order(self, order_id: str) -> None:
            raise DataError("SELECT", {}, Exception("invalid byte sequence"))

    services = DemoServices(Settings.from_env({}))
    services.__dict__["payments"] = Refusing()  # the cached_property's slot
    tool = demo_registry(services).require("refund_payment")
    args = gate.validate_arguments(tool, REFUND)
    assert tool.resolve is not None
    with pytest.raises(ToolError) as info:
        tool.resolve(args, Principal("t", "u", ("support",)))
    assert info.value.code == ErrorCode.INVALID_ARGUMENTS and not info.value.retryable
    assert info.value.details[0]["path"] == "/order_id"


# --- a property: the checks never raise anything but InputError -----------------------------

hostile_text = st.text(
    st.characters(exclude_categories=()),  # surrogates and NUL included
    max_size=20,
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities included
    | hostile_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, database=None)
@given(
    arguments=json_values | json_values.map(lambda v: json.dumps(v)) | hostile_text,
    call_id=hostile_text,
    user_id=hostile_text,
)
def test_checks_raise_only_input_errors(arguments: Any, call_id: str, user_id: str) -> None:
    proposals = [{"call_id": call_id, "tool_name": "get_news", "arguments": arguments}]
    try:
        checked = check_submission(proposals, {**CTX, "user_id": user_id}, None, limits=LIMITS)
    except InputError as exc:
        assert "\n" not in exc.message
        exc.message.encode("utf-8")
        return
    # What passes holds no character PostgreSQL refuses, in any key or string.
    stored = json.dumps(checked.calls[0].arguments, ensure_ascii=False)
    assert values.unstorable(stored) is None


PROPOSED_REFUND = {"call_id": "c1", "tool_name": "refund_payment", "arguments": {"order_id": "A-1"}}


def test_a_proposal_may_name_its_own_operation() -> None:
    limits = LIMITS
    checked = check_submission(
        [{**PROPOSED_REFUND, "operation_id": "refund-A-1"}], CTX, None, limits=limits
    )
    assert checked.operation_ids == {"c1": "refund-A-1"}
    (planned,) = plan(checked.calls, checked.context, demo_registry(), checked.operation_ids)
    assert planned.operation_id == "refund-A-1"
    # The same id both ways is one name; two different ones are refused, naming neither.
    same = check_submission(
        [{**PROPOSED_REFUND, "operation_id": "refund-A-1"}],
        CTX,
        {"c1": "refund-A-1"},
        limits=limits,
    )
    assert same.operation_ids == {"c1": "refund-A-1"}
    with pytest.raises(InputError, match="two different operations") as refused:
        check_submission(
            [{**PROPOSED_REFUND, "operation_id": "refund-A-1"}],
            CTX,
            {"c1": "refund-B-2"},
            limits=limits,
        )
    assert "refund-A-1" not in refused.value.message and "refund-B-2" not in refused.value.message
    with pytest.raises(InputError, match="operation_id"):
        check_submission([{**PROPOSED_REFUND, "operation_id": "bad\nid"}], CTX, None, limits=limits)
