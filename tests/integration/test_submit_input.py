"""Hostile input at ``Producer.submit``, against real Postgres and Redis (no workers).

Every refusal is a ``CallgateError`` with a stable code and a one-line message, and nothing
is stored: the rows of callgate.turns, calls and operations are counted before and after.
Issue 8's holes: 11 (values Postgres cannot hold), 12 (an operation id twice in one turn),
14 (tracebacks instead of errors), 15 (wrong codes), 16 (nothing capped).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from sqlalchemy import Engine

from callgate.core.errors import CallgateError, ErrorCode
from callgate.core.settings import Settings
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer import Producer
from callgate.producer.planning import plan
from callgate.queue import transport
from callgate.store import db, turns
from tests.integration.conftest import stored

CTX: dict[str, Any] = {
    "request_id": "req-1",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}
NEWS = {"call_id": "c-1", "tool_name": "get_news", "arguments": {"topic": "rates"}}
REFUND_1 = {
    "call_id": "c-1",
    "tool_name": "refund_payment",
    "arguments": {"order_id": "O-17", "amount": 1, "currency": "KRW"},
}
REFUND_2 = {**REFUND_1, "call_id": "c-2", "arguments": {**REFUND_1["arguments"], "amount": 2}}
MB = 1024 * 1024


def news(arguments: Any, call_id: str = "c-1") -> dict[str, Any]:
    return {"call_id": call_id, "tool_name": "get_news", "arguments": arguments}


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


# (case name, proposals, context, operation ids, expected code, hole)
REFUSED: list[tuple[str, list[Any], dict[str, Any], dict[str, str] | None, str]] = [
    # 11: a NUL hidden in string-form arguments parses to a value Postgres cannot store.
    (
        "nul escape in string arguments",
        [news('{"topic": "a\\u0000b"}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    (
        "nul escape in a string-argument key",
        [news('{"to\\u0000pic": "a"}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    (
        "raw nul in string arguments",
        [news('{"topic": "a\x00b"}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    ("nul in object arguments", [news({"topic": "a\x00b"})], CTX, None, "invalid_input"),
    ("nul in an object-argument key", [news({"a\x00": {"b": 1}})], CTX, None, "invalid_input"),
    ("nul in a nested list", [news({"topic": ["ok", {"x": "\x00"}]})], CTX, None, "invalid_input"),
    ("nul in a call id", [news({"topic": "a"}, call_id="c\x00")], CTX, None, "invalid_input"),
    ("nul in a tool name", [{**NEWS, "tool_name": "get_news\x00"}], CTX, None, "invalid_input"),
    ("nul in request_id", [NEWS], {**CTX, "request_id": "r\x00"}, None, "invalid_input"),
    ("nul in tenant_id", [NEWS], {**CTX, "tenant_id": "t\x00"}, None, "invalid_input"),
    ("nul in user_id", [NEWS], {**CTX, "user_id": "u\x00"}, None, "invalid_input"),
    ("nul in a role", [NEWS], {**CTX, "roles": ["support\x00"]}, None, "invalid_input"),
    ("nul in conversation_id", [NEWS], {**CTX, "conversation_id": "c\x00"}, None, "invalid_input"),
    ("nul in an operation id", [REFUND_1], CTX, {"c-1": "op\x00"}, "invalid_input"),
    # 14: lone surrogates, non-JSON numbers, deep nesting.
    (
        "lone surrogate in object arguments",
        [news({"topic": "a\ud800"})],
        CTX,
        None,
        "invalid_input",
    ),
    (
        "lone surrogate escape in string arguments",
        [news('{"topic": "a\\ud800"}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    (
        "raw lone surrogate in string arguments",
        [news('{"topic": "a\udfff"}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    (
        "lone surrogate in a call id",
        [news({"topic": "a"}, call_id="c\ud800")],
        CTX,
        None,
        "invalid_input",
    ),
    ("lone surrogate in user_id", [NEWS], {**CTX, "user_id": "u\udc00"}, None, "invalid_input"),
    ("NaN in object arguments", [news({"topic": float("nan")})], CTX, None, "invalid_input"),
    ("Infinity in object arguments", [news({"topic": float("inf")})], CTX, None, "invalid_input"),
    ("NaN in string arguments", [news('{"topic": NaN}')], CTX, None, "invalid_arguments_json"),
    (
        "-Infinity in string arguments",
        [news('{"topic": -Infinity}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    ("1e400 in string arguments", [news('{"topic": 1e400}')], CTX, None, "invalid_arguments_json"),
    (
        "a 5000-digit integer in string arguments",
        [news('{"n": ' + "9" * 5000 + "}")],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    (
        "a 5000-digit integer in object arguments",
        [news({"n": 10**5000})],
        CTX,
        None,
        "invalid_input",
    ),
    ("1,000 levels of object arguments", [news(nested(1000))], CTX, None, "invalid_input"),
    ("100,000 levels of object arguments", [news(nested(100_000))], CTX, None, "invalid_input"),
    (
        "1,000 levels of string arguments",
        [news('{"a":' * 1000 + "1" + "}" * 1000)],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    (
        "10,000 levels of string arguments",
        [news('{"a":' * 10_000 + "1" + "}" * 10_000)],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    ("a set in object arguments", [news({"topic": {"a", "b"}})], CTX, None, "invalid_input"),
    (
        "a non-string key in object arguments",
        [news({"topic": {1: "a"}})],
        CTX,
        None,
        "invalid_input",
    ),
    # 12: one operation id for two calls of one turn.
    (
        "two calls share an operation id",
        [REFUND_1, REFUND_2],
        CTX,
        {"c-1": "op-shared", "c-2": "op-shared"},
        "invalid_input",
    ),
    # 15: an oversized or unprintable operation id is input, not an unreachable database.
    ("a 10 KB operation id", [REFUND_1], CTX, {"c-1": "o" * 10_000}, "invalid_input"),
    ("a 3 KB operation id", [REFUND_1], CTX, {"c-1": "o" * 3_000}, "invalid_input"),
    ("an operation id with a newline", [REFUND_1], CTX, {"c-1": "op\n1"}, "invalid_input"),
    ("a blank operation id", [REFUND_1], CTX, {"c-1": "   "}, "invalid_input"),
    # 16: caps, duplicate keys, blank ids.
    (
        "10 MB string arguments",
        [news(json.dumps({"topic": "x" * (10 * MB)}))],
        CTX,
        None,
        "invalid_input",
    ),
    ("10 MB object arguments", [news({"topic": "x" * (10 * MB)})], CTX, None, "invalid_input"),
    ("a 10 MB request_id", [NEWS], {**CTX, "request_id": "r" * (10 * MB)}, None, "invalid_input"),
    (
        "100,000 roles",
        [NEWS],
        {**CTX, "roles": [f"r{i}" for i in range(100_000)]},
        None,
        "invalid_input",
    ),
    (
        "a 10,000-call turn",
        [news({"topic": "a"}, call_id=f"c-{i}") for i in range(10_000)],
        CTX,
        None,
        "invalid_input",
    ),
    (
        "a duplicate key in string arguments",
        [news('{"topic": "a", "topic": "b"}')],
        CTX,
        None,
        "invalid_arguments_json",
    ),
    ("a call id of spaces", [news({"topic": "a"}, call_id="   ")], CTX, None, "invalid_input"),
    ("an empty call id", [news({"topic": "a"}, call_id="")], CTX, None, "invalid_input"),
    ("a call id with a tab", [news({"topic": "a"}, call_id="c\t1")], CTX, None, "invalid_input"),
    ("a user_id of spaces", [NEWS], {**CTX, "user_id": "  "}, None, "invalid_input"),
    ("a hostile extra key", [{**NEWS, "x\ny\x00": 1}], CTX, None, "invalid_input"),
]


@pytest.mark.parametrize(
    ("proposals", "context", "operation_ids", "code"),
    [pytest.param(*case[1:], id=case[0]) for case in REFUSED],
)
def test_hostile_input_is_refused_with_a_code_and_nothing_is_stored(
    producer: Producer,
    engine: Engine,
    proposals: list[Any],
    context: dict[str, Any],
    operation_ids: dict[str, str] | None,
    code: str,
) -> None:
    before = stored(engine)
    with pytest.raises(CallgateError) as info:
        producer.submit(proposals, context, operation_ids=operation_ids)
    assert info.value.code == code, info.value
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    message.encode("utf-8")  # printable on any terminal: no lone surrogate in the text
    assert stored(engine) == before


def test_string_arguments_that_are_simply_not_json_are_left_to_the_gate(
    producer: Producer, engine: Engine
) -> None:
    # The gate's first check refuses them per call (invalid_arguments_json), so the model
    # learns which call to fix; submit records them as given.
    before = stored(engine)
    turn = producer.submit([news('{"topic":'), news("[1, 2]", call_id="c-2")], CTX)
    after = stored(engine)
    assert after == (before[0] + 1, before[1] + 2, before[2] + 2)
    assert len(turn.calls) == 2


def test_limits_come_from_settings(database_url: str, redis_url: str, queue_name: str) -> None:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
            "CALLGATE_MAX_CALL_BYTES": "2048",
            "CALLGATE_MAX_TURN_CALLS": "2",
        }
    )
    producer = Producer(
        settings=settings,
        engine=db.create(database_url),
        redis_connection=transport.connect(redis_url),
        registry=demo_registry(),
    )
    try:
        before = stored(producer.engine)
        with pytest.raises(CallgateError) as info:
            producer.submit([news({"topic": "a"}, call_id=f"c-{i}") for i in range(3)], CTX)
        assert info.value.code == ErrorCode.INVALID_INPUT and "at most 2" in info.value.message
        with pytest.raises(CallgateError) as info:
            producer.submit([news({"topic": "x" * 2100})], CTX)
        assert info.value.code == ErrorCode.INVALID_INPUT and "2048" in info.value.message
        assert stored(producer.engine) == before
        # At the limits, the turn is stored.
        producer.submit([news({"topic": "x" * 2000}, call_id=f"c-{i}") for i in range(2)], CTX)
        assert stored(producer.engine)[1] == before[1] + 2
    finally:
        producer.close()


def test_one_operation_id_in_two_turns_is_still_allowed(producer: Producer, engine: Engine) -> None:
    # Reusing an operation id across turns is how a logical write is retried: only within
    # one turn is it refused.
    producer.submit([REFUND_1], CTX, operation_ids={"c-1": "op-retried"})
    before = stored(engine)
    producer.submit([REFUND_1], CTX, operation_ids={"c-1": "op-retried"})
    assert stored(engine) == (before[0] + 1, before[1] + 1, before[2])


# --- hole 15: what the database refuses is input, not an unreachable database ----------------


def _planned_with(operation_id: str, topic: str = "rates") -> list[turns.PlannedCall]:
    call = ProposedCall(call_id="c-1", tool_name="get_news", arguments={"topic": topic})
    return plan([call], CallContext(**CTX), demo_registry(), {"c-1": operation_id})


@pytest.mark.parametrize(
    "planned",
    [
        # Past the btree's row size: ProgramLimitExceeded, an OperationalError subclass.
        pytest.param(lambda: _planned_with(os.urandom(6000).hex()), id="oversized index key"),
        pytest.param(lambda: _planned_with("op-1", topic="a\x00"), id="nul in jsonb"),
    ],
)
def test_a_value_the_database_refuses_is_invalid_input_not_unavailable(
    engine: Engine, planned: Any
) -> None:
    # Below submit's own checks (which refuse both first): the last line of defence.
    before = stored(engine)
    with pytest.raises(CallgateError) as info, db.translate_errors("submit"):
        turns.record(engine, CallContext(**CTX), planned())
    assert info.value.code == ErrorCode.INVALID_INPUT, info.value
    assert "\n" not in info.value.message and "SELECT" not in info.value.message
    assert stored(engine) == before


def test_a_lone_surrogate_below_submit_is_invalid_input(engine: Engine) -> None:
    ctx = CallContext.model_construct(**{**CTX, "roles": ("support",), "user_id": "u\ud800"})
    call = ProposedCall(call_id="c-1", tool_name="get_news", arguments={"topic": "a"})
    before = stored(engine)
    with pytest.raises(CallgateError) as info, db.translate_errors("submit"):
        turns.record(engine, ctx, plan([call], ctx, demo_registry()))
    assert info.value.code == ErrorCode.INVALID_INPUT
    assert stored(engine) == before
