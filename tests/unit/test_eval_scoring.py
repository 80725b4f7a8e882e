"""The eval's pure parts: matchers, the model's and the executor's checks, compare, and the
fixture loader's errors. No services."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from callgate.core.errors import InputError
from callgate.ops.lab.eval import compare, matchers, report
from callgate.ops.lab.eval.cli import eval_group
from callgate.ops.lab.eval.fixture import (
    ExpectedCall,
    Outcome,
    Turn,
    load_fixture,
    load_suite,
    with_responses,
)
from callgate.ops.lab.eval.scoring import Executed, Proposed, TurnRun, score

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
    "additionalProperties": False,
}
REFUND = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["order_id", "amount"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "get_stock": {"type": "object"}, "refund_payment": REFUND}


@pytest.mark.parametrize(
    ("raw", "value", "ok"),
    [
        ("Seoul", "Seoul", True),
        ("Seoul", "seoul", False),
        (3, 3.0, True),
        (1, True, False),
        ({"one_of": ["Seoul", "서울"]}, "서울", True),
        ({"one_of": ["Seoul", "서울"]}, "Busan", False),
        ({"range": {"min": 1, "max": 5}}, 5, True),
        ({"range": {"min": 1}}, 0.5, False),
        ({"range": {"max": 5}}, "3", False),
        ({"regex": "O-[0-9]+"}, "O-17", True),
        ({"regex": "O-[0-9]+"}, "O-17x", False),
        ({"any": True}, None, True),
        ({"optional": {"one_of": ["celsius"]}}, "fahrenheit", False),
    ],
)
def test_matchers(raw: object, value: object, ok: bool) -> None:
    assert matchers.matches(matchers.parse(raw), value) is ok


def test_an_optional_argument_may_be_left_out_but_no_unnamed_one_given() -> None:
    expected = {
        "city": matchers.parse("Seoul"),
        "unit": matchers.parse({"optional": {"one_of": ["celsius"]}}),
    }
    assert matchers.arguments_match(expected, {"city": "Seoul"})
    assert matchers.arguments_match(expected, {"city": "Seoul", "unit": "celsius"})
    assert not matchers.arguments_match(expected, {"city": "Seoul", "extra": 1})
    assert not matchers.arguments_match({"city": matchers.parse("Seoul")}, {})


def _turn(calls: list[dict[str, object]], **more: object) -> Turn:
    return Turn.model_validate({"answers": {}, "calls": calls, **more})


def _run(turn: Turn, proposed: list[Proposed], executed: list[Executed], **more: object) -> TurnRun:
    fields: dict[str, object] = {
        "fixture_id": "f",
        "category": "parallel",
        "turn_index": 0,
        "answer": "good",
        "surface": "openai-chat",
        "expect": turn,
        "exposed": frozenset({"get_weather", "get_stock", "refund_payment"}),
        "schemas": SCHEMAS,
        "proposed": proposed,
        "executed": executed,
        "turn_id": "t-1",
        **more,
    }
    return TurnRun(**fields)  # type: ignore[arg-type]


def _done(call_id: str, tool: str, outcome: str, runs: int = 1, effects: int = 0) -> Executed:
    return Executed(call_id, tool, outcome, runs, effects, f"ref-{call_id}")


def _by_metric(run: TurnRun) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for c in score(run):
        out.setdefault(c.metric, []).append(c.passed)
    return out


PARALLEL = [
    {"name": "get_weather", "arguments": {"city": {"one_of": ["Seoul", "서울"]}}},
    {"name": "get_stock", "arguments": {"symbol": "NVDA"}},
]


def test_a_parallel_set_matches_in_any_order() -> None:
    turn = _turn(PARALLEL, executor={"get_stock": {"outcome": "upstream_unavailable"}})
    proposed = [
        Proposed("b", "get_stock", {"symbol": "NVDA"}),
        Proposed("a", "get_weather", {"city": "서울"}),
    ]
    executed = [
        _done("b", "get_stock", "upstream_unavailable"),
        _done("a", "get_weather", "succeeded"),
    ]
    checks = _by_metric(_run(turn, proposed, executed))
    assert all(all(v) for v in checks.values()), checks
    assert checks["parallel_completeness"] == [True]
    assert checks["partial_failures_visible"] == [True]


def test_a_wrong_argument_and_a_missing_call_fail_only_model_checks() -> None:
    turn = _turn(PARALLEL)
    proposed = [Proposed("a", "get_weather", {"city": "Busan"})]
    checks = _by_metric(_run(turn, proposed, [_done("a", "get_weather", "succeeded")]))
    assert checks["selection_accuracy"] == [False]
    assert checks["argument_accuracy"] == [False, False]
    assert checks["parallel_completeness"] == [False]
    assert checks["argument_validity"] == [True]
    assert all(checks["correlation"])


def test_an_invented_tool_is_a_model_failure_and_the_executor_must_refuse_it() -> None:
    turn = _turn([])
    proposed = [Proposed("m", "get_internal_metric", {"name": "DAU-7"})]
    refused = _by_metric(
        _run(turn, proposed, [_done("m", "get_internal_metric", "unknown_tool", runs=0)])
    )
    assert refused["hallucinated_tool_rate"] == [False]
    assert refused["irrelevance_accuracy"] == [False]
    assert refused["policy_catch_rate"] == [True]
    assert refused["handler_runs_on_refusal"] == [True]
    ran = _by_metric(
        _run(turn, proposed, [_done("m", "get_internal_metric", "unknown_tool", runs=1)])
    )
    assert ran["handler_runs_on_refusal"] == [False]


def test_side_effects_are_counted_against_the_rule_of_a_matching_call() -> None:
    turn = _turn(
        [{"name": "refund_payment", "arguments": {"order_id": "O-17", "amount": 12000}}],
        executor={
            "refund_payment": {
                "outcome": "succeeded",
                "effects": 1,
                "otherwise": "refund_amount_exceeded",
            }
        },
    )
    good = [Proposed("r", "refund_payment", {"order_id": "O-17", "amount": 12000})]
    once = _by_metric(_run(turn, good, [_done("r", "refund_payment", "succeeded", 2, 1)]))
    twice = _by_metric(_run(turn, good, [_done("r", "refund_payment", "succeeded", 2, 2)]))
    assert once["side_effect_exactness"] == [True]
    assert twice["side_effect_exactness"] == [False]
    assert twice["argument_accuracy"] == [True]  # the model's side did not move
    too_much = [Proposed("r", "refund_payment", {"order_id": "O-17", "amount": 120000})]
    caught = _by_metric(
        _run(turn, too_much, [_done("r", "refund_payment", "refund_amount_exceeded", 0)])
    )
    assert caught["policy_catch_rate"] == [True]
    assert caught["argument_accuracy"] == [False]
    assert caught["side_effect_exactness"] == [True]  # a refused call made no effect


def test_a_result_without_its_call_id_breaks_correlation() -> None:
    turn = _turn([{"name": "get_stock", "arguments": {"symbol": "NVDA"}}])
    proposed = [Proposed("a", "get_stock", {"symbol": "NVDA"})]
    checks = _by_metric(_run(turn, proposed, [], joined=False))
    assert checks["correlation"] == [False]


def test_the_final_answer_must_use_the_result_and_not_report_a_failure_as_done() -> None:
    turn = _turn(
        [{"name": "get_weather", "arguments": {"city": "Seoul"}}],
        final={"answers": {}, "requires": ["{get_weather.temperature}°C"], "forbids": ["달러"]},
    )
    proposed = [Proposed("a", "get_weather", {"city": "Seoul"})]
    done = Executed("a", "get_weather", "succeeded", 1, 0, "ref", data={"temperature": -2})
    right = _by_metric(_run(turn, proposed, [done], final_text="서울은 -2°C입니다."))
    wrong = _by_metric(_run(turn, proposed, [done], final_text="서울은 3°C, 주가는 10달러"))
    assert right["final_answer_correctness"] == [True]
    assert wrong["final_answer_correctness"] == [False]


def test_expected_calls_and_outcomes_validate() -> None:
    assert ExpectedCall.model_validate({"name": "x", "arguments": {"a": 1}}).arguments["a"]
    with pytest.raises(ValueError, match="approval"):
        Outcome.model_validate({"outcome": "succeeded", "approval": {"shows": {}}})


def test_a_malformed_fixture_names_its_file_id_and_field(tmp_path: Path) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(
        "id: weather-1\ncategory: simple\nrequest: 날씨\n"
        "principal: {user_id: u, tenant_id: t, roles: []}\ntools: [get_weather]\n"
        "turns: [{answers: {}, calls: []}]\n"
    )
    with pytest.raises(InputError) as caught:
        load_fixture(file)
    message = caught.value.message
    assert str(file) in message and "'weather-1'" in message and "/principal/roles" in message
    assert caught.value.code == "invalid_input"
    file.write_text("id: [unclosed\n")
    with pytest.raises(InputError, match="not valid YAML at line"):
        load_fixture(file)


def test_the_builtin_suite_loads_with_good_and_bad_answers_on_two_surfaces() -> None:
    suite = load_suite(Path("builtin"))
    assert len(suite.fixtures) >= 6
    for fixture in suite.fixtures:
        assert {"good", "bad"} <= fixture.answer_sets()
        assert len(fixture.surfaces("good")) >= 2 and len(fixture.surfaces("bad")) >= 2


def _report(**values: float) -> dict[str, object]:
    metrics = report.metrics([])
    for key, value in values.items():
        metrics[key]["value"] = value
    return {"metrics": metrics}


def test_compare_flags_a_fall_and_a_fivefold_error_rate_only() -> None:
    base = _report(selection_accuracy=0.9, hallucinated_tool_rate=0.01)
    assert not any(c.regression for c in compare.compare(base, base))
    fell = compare.compare(base, _report(selection_accuracy=0.85, hallucinated_tool_rate=0.01))
    assert [c.key for c in fell if c.regression] == ["selection_accuracy"]
    fivefold = compare.compare(base, _report(selection_accuracy=0.9, hallucinated_tool_rate=0.05))
    assert [c.key for c in fivefold if c.regression] == ["hallucinated_tool_rate"]
    better = compare.compare(base, _report(selection_accuracy=1.0, hallucinated_tool_rate=0.0))
    assert not any(c.regression for c in better)


def test_compare_exits_1_on_a_regression_and_0_otherwise(tmp_path: Path) -> None:
    base, worse = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(_report(side_effect_exactness=1.0)))
    worse.write_text(json.dumps(_report(side_effect_exactness=0.9)))
    runner = CliRunner()
    assert runner.invoke(eval_group, ["compare", str(base), str(base)]).exit_code == 0
    flagged = runner.invoke(eval_group, ["compare", str(base), str(worse)])
    assert flagged.exit_code == 1 and "REGRESSION" in flagged.output


def test_the_html_page_is_self_contained() -> None:
    doc = {
        "suite": "s",
        "answer": "good",
        "fixtures": 1,
        "surfaces": ["openai-chat"],
        "seconds": 1.0,
        "metrics": report.metrics([]),
        "categories": {"simple": {"model": 1.0, "executor": 0.5, "final": None}},
        "failures": [],
    }
    page = report.page(doc)
    assert "<svg" in page and "http://www.w3.org/2000/svg" in page
    assert "<script" not in page and "src=" not in page and "href=" not in page


def test_responses_from_a_folder_become_an_answer_set(tmp_path: Path) -> None:
    suite = load_suite(Path("builtin"))
    good = next(f for f in suite.fixtures if f.id == "cancel-other-tenant-order")
    recorded = good.turns[0].answers["good"]["anthropic-messages"]
    (tmp_path / "cancel-other-tenant-order.1.anthropic-messages.json").write_text(
        json.dumps(recorded)
    )
    mine = with_responses(suite, tmp_path, "claude-run")
    kept = [f.id for f in mine.fixtures if f.surfaces("claude-run")]
    assert kept == ["cancel-other-tenant-order"]
    fixture = next(f for f in mine.fixtures if f.id == "cancel-other-tenant-order")
    assert fixture.turns[0].answers["claude-run"]["anthropic-messages"] == recorded
    (tmp_path / "no-such-fixture.1.openai-chat.json").write_text("{}")
    with pytest.raises(InputError, match="no fixture 'no-such-fixture'"):
        with_responses(suite, tmp_path, "claude-run")


def test_a_failure_left_pending_beside_a_result_is_not_visible() -> None:
    turn = _turn(PARALLEL)
    proposed = [
        Proposed("a", "get_weather", {"city": "Seoul"}),
        Proposed("b", "get_stock", {"symbol": "NVDA"}),
        Proposed("c", "get_stock", {"symbol": "AAPL"}),
    ]
    executed = [
        _done("a", "get_weather", "succeeded"),
        _done("b", "get_stock", "upstream_unavailable"),
        _done("c", "get_stock", "pending"),
    ]
    assert _by_metric(_run(turn, proposed, executed))["partial_failures_visible"] == [False]
