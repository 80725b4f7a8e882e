"""Fan-in (producer/fanin.py): results join proposals by call id, never by position."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.core.errors import CorrelationError, ErrorCode
from callgate.core.types import FailedRetryable, FailedTerminal, Succeeded
from callgate.producer.fanin import FanIn, correlate

PROPOSALS = [
    ("call-1", "get_weather"),
    ("call-2", "refund_payment"),
    ("call-3", "get_stock"),
]


def ok(call_id: str, tool_name: str, **data: Any) -> dict[str, Any]:
    return {"status": "succeeded", "call_id": call_id, "tool_name": tool_name, "data": data}


def failed(call_id: str, tool_name: str, status: str, code: str) -> dict[str, Any]:
    return {
        "status": status,
        "call_id": call_id,
        "tool_name": tool_name,
        "error": {"code": code},
    }


def all_results() -> list[dict[str, Any]]:
    return [
        ok("call-1", "get_weather", temperature=21),
        failed("call-2", "refund_payment", "failed_terminal", "refund_amount_exceeded"),
        ok("call-3", "get_stock", price=12.5),
    ]


def test_reverse_arrival_comes_out_in_proposal_order() -> None:
    results = correlate(PROPOSALS, reversed(all_results()))
    assert [r.call_id for r in results] == ["call-1", "call-2", "call-3"]
    assert [r.tool_name for r in results] == ["get_weather", "refund_payment", "get_stock"]
    assert isinstance(results[0], Succeeded)
    assert results[0].data == {"temperature": 21}
    assert isinstance(results[2], Succeeded)
    assert results[2].data == {"price": 12.5}


def test_join_is_by_call_id_not_position() -> None:
    shuffled = [all_results()[i] for i in (2, 0, 1)]
    fan = FanIn(PROPOSALS)
    fan.add_all(shuffled)
    assert fan.complete
    assert [r.call_id for r in fan.ordered()] == ["call-1", "call-2", "call-3"]


def test_identical_duplicate_is_dropped_and_counted() -> None:
    fan = FanIn(PROPOSALS)
    first = ok("call-1", "get_weather", temperature=21)
    assert fan.add(first) is True
    assert fan.add(dict(first)) is False
    assert fan.add(ok("call-1", "get_weather", temperature=21)) is False
    assert fan.duplicates == 2
    assert len(fan.results) == 1
    assert fan.pending == ["call-2", "call-3"]


def test_correlate_tolerates_duplicates() -> None:
    raws = all_results()
    results = correlate(PROPOSALS, [*raws, raws[1], raws[0]])
    assert [r.call_id for r in results] == ["call-1", "call-2", "call-3"]


def test_different_second_result_is_an_error() -> None:
    fan = FanIn(PROPOSALS)
    fan.add(ok("call-1", "get_weather", temperature=21))
    with pytest.raises(CorrelationError) as info:
        fan.add(ok("call-1", "get_weather", temperature=22))
    assert info.value.code == ErrorCode.DUPLICATE_RESULT
    # the first result stands
    assert isinstance(fan.results["call-1"], Succeeded)
    assert fan.results["call-1"].data == {"temperature": 21}


def test_success_after_failure_for_one_call_is_an_error() -> None:
    fan = FanIn(PROPOSALS)
    fan.add(failed("call-2", "refund_payment", "failed_retryable", "upstream_unavailable"))
    with pytest.raises(CorrelationError) as info:
        fan.add(ok("call-2", "refund_payment", refund_id="r-1"))
    assert info.value.code == ErrorCode.DUPLICATE_RESULT
    assert isinstance(fan.results["call-2"], FailedRetryable)


def test_result_for_unknown_call_is_extra() -> None:
    fan = FanIn(PROPOSALS)
    with pytest.raises(CorrelationError) as info:
        fan.add(ok("call-9", "get_weather"))
    assert info.value.code == ErrorCode.EXTRA_RESULT
    assert fan.results == {}


def test_result_with_another_tools_name_is_a_mismatch() -> None:
    fan = FanIn(PROPOSALS)
    with pytest.raises(CorrelationError) as info:
        fan.add(ok("call-1", "get_stock", price=1.0))
    assert info.value.code == ErrorCode.TOOL_NAME_MISMATCH
    assert fan.results == {}


@pytest.mark.parametrize("status", ["started", "proposed", None])
def test_non_terminal_status_is_rejected(status: str | None) -> None:
    fan = FanIn(PROPOSALS)
    raw = {"status": status, "call_id": "call-1", "tool_name": "get_weather", "data": {}}
    with pytest.raises(CorrelationError) as info:
        fan.add(raw)
    assert info.value.code == ErrorCode.NON_TERMINAL_RESULT
    assert fan.results == {}


def test_correlate_reports_a_missing_result() -> None:
    raws = all_results()
    with pytest.raises(CorrelationError) as info:
        correlate(PROPOSALS, [raws[0], raws[2]])
    assert info.value.code == ErrorCode.MISSING_RESULT
    assert "call-2" in info.value.message


def test_correlate_with_no_results_reports_missing() -> None:
    with pytest.raises(CorrelationError) as info:
        correlate(PROPOSALS, [])
    assert info.value.code == ErrorCode.MISSING_RESULT


def test_pending_lists_missing_calls_in_proposal_order() -> None:
    fan = FanIn(PROPOSALS)
    assert fan.pending == ["call-1", "call-2", "call-3"]
    assert not fan.complete
    fan.add(ok("call-2", "refund_payment", refund_id="r-1"))
    assert fan.pending == ["call-1", "call-3"]
    fan.add(ok("call-3", "get_stock", price=1.0))
    assert fan.pending == ["call-1"]
    assert [r.call_id for r in fan.ordered()] == ["call-2", "call-3"]
    fan.add(ok("call-1", "get_weather", temperature=3))
    assert fan.pending == []
    assert fan.complete


@pytest.mark.parametrize(
    ("status", "cls"),
    [("failed_terminal", FailedTerminal), ("failed_retryable", FailedRetryable)],
)
def test_failure_is_never_turned_into_success(status: str, cls: type) -> None:
    raws = all_results()
    raws[1] = failed("call-2", "refund_payment", status, "upstream_unavailable")
    results = correlate(PROPOSALS, raws)
    refund = results[1]
    assert type(refund) is cls
    assert not isinstance(refund, Succeeded)
    assert refund.status == status
    assert refund.error.code == "upstream_unavailable"


def test_failed_result_carrying_data_is_not_accepted_as_success() -> None:
    raw = failed("call-2", "refund_payment", "failed_terminal", "execution_failed")
    raw["data"] = {"refund_id": "r-1"}
    fan = FanIn(PROPOSALS)
    with pytest.raises(CorrelationError):
        fan.add(raw)
    assert "call-2" not in fan.results


def test_repeated_call_id_in_the_proposals_is_bad_input() -> None:
    with pytest.raises(CorrelationError) as info:
        FanIn([("call-1", "get_weather"), ("call-1", "get_weather")])
    assert info.value.code == ErrorCode.INVALID_INPUT


@pytest.mark.parametrize("raw", [["call-1"], "call-1", {"call_id": ["x"]}, None])
def test_result_that_is_not_an_object_is_rejected(raw: object) -> None:
    with pytest.raises(CorrelationError):
        FanIn(PROPOSALS).add(raw)  # type: ignore[arg-type]
