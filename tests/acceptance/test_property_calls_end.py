"""Property: whatever a model proposes, submit either records a turn whose every call then
ends (real workers, relayer and sweeper), or refuses it with a stable code and records
nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from callgate.core.errors import CallgateError, ErrorCode
from callgate.producer import Producer
from tests.acceptance.conftest import SUPPORT_A, scalar

TOOLS = ["get_news", "get_weather", "get_stock", "send_email", "refund_payment", "no_such_tool"]

text = st.text(st.characters(codec=None, categories=None), max_size=40) | st.sampled_from(
    ["", " ", "\x00", "\ud83d", "a\x00b", "O-17", "celsius", "Seoul", "x" * 5000]
)
numbers = st.integers(min_value=-(10**30), max_value=10**30) | st.floats(allow_nan=True)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
arguments = (
    st.dictionaries(
        st.sampled_from(["topic", "city", "unit", "symbol", "to", "template", "order_id"]) | text,
        json_values,
        max_size=4,
    )
    | text
    | st.builds(lambda depth: "[" * depth + "]" * depth, st.integers(0, 3000)).map(
        lambda s: '{"topic": ' + s + "}"
    )
)
proposals = st.lists(
    st.fixed_dictionaries(
        {
            "call_id": text | st.uuids().map(str),
            "tool_name": st.sampled_from(TOOLS),
            "arguments": arguments,
        }
    ),
    min_size=1,
    max_size=3,
)
contexts = st.fixed_dictionaries(
    {"request_id": text | st.just("req-p"), "tenant_id": st.just("tenant-a")}
).map(lambda c: {**SUPPORT_A, **c})


def _counts(engine: Engine) -> tuple[int, int, int]:
    return (
        int(scalar(engine, "SELECT count(*) FROM callgate.turns")),
        int(scalar(engine, "SELECT count(*) FROM callgate.calls")),
        int(scalar(engine, "SELECT count(*) FROM callgate.operations")),
    )


def test_every_submission_is_refused_cleanly_or_all_its_calls_end(
    producer: Producer, stack: Any, engine: Engine
) -> None:
    stack(workers=2)
    codes = {c.value for c in ErrorCode}

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )
    @given(calls=proposals, context=contexts)
    def check(calls: list[dict[str, Any]], context: dict[str, Any]) -> None:
        before = _counts(engine)
        try:
            turn = producer.submit(calls, context)
        except CallgateError as err:
            assert err.code.value in codes
            assert _counts(engine) == before, "a refused submission stored something"
            return
        collected = producer.collect(turn.turn_id, timeout=30)
        assert collected.complete, f"calls never ended: {collected.pending}"
        assert len(collected.results) == len(calls)

    check()
