"""``callgate eval import-bfcl``: BFCL's files become a suite of read-only stubs whose
fixtures score a model's recorded results as BFCL's AST checker does. Pure: the files in
tests/fixtures/bfcl/import (written in BFCL's format) and the real extract in
tests/fixtures/bfcl/retrieval; no services, no download."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from callgate.core.errors import InputError
from callgate.ops.lab.eval import bfcl, bfcl_decode, stubs
from callgate.ops.lab.eval.cli import eval_group
from callgate.ops.lab.eval.fixture import Suite, load_suite, with_responses
from callgate.ops.lab.eval.matchers import BfclSpec, bfcl_matches, standardize
from callgate.ops.lab.eval.scoring import Proposed, TurnRun, model_checks
from callgate.ops.lab.eval.surfaces import mentioned_names
from callgate.producer import adapters
from callgate.tools.registry import READ_ONLY

FILES = Path(__file__).parents[1] / "fixtures" / "bfcl" / "import"
REAL = Path(__file__).parents[1] / "fixtures" / "bfcl" / "retrieval" / "BFCL_v4_multiple.json"
FC = FILES / "result" / "fc-model"
PROMPT = FILES / "result" / "prompt-model"


def _import(tmp_path: Path, questions: Path, *args: str) -> tuple[Path, str]:
    out = tmp_path / questions.stem
    ran = CliRunner().invoke(
        eval_group,
        ["import-bfcl", str(questions), "--out", str(out), *args],
        catch_exceptions=False,
    )
    assert ran.exit_code == 0, ran.output
    return out, ran.output


def _scored(suite: Suite, answer: str) -> dict[str, dict[str, bool]]:
    """Fixture id → metric → passed, for the recorded ``answer`` read by the openai-chat
    adapter, as ``eval run`` reads it (without running the calls)."""
    schemas = {
        t["name"]: t["parameters"] for t in json.loads((suite.path / "tools.json").read_text())
    }
    out: dict[str, dict[str, bool]] = {}
    for fixture in suite.fixtures:
        turn = fixture.turns[0]
        response = turn.answers[answer]["openai-chat"]
        known = set(schemas) | set(fixture.tools) | mentioned_names("openai-chat", response)
        proposals = adapters.read_proposals("openai-chat", response, known)
        run = TurnRun(
            fixture_id=fixture.id,
            category=fixture.category,
            turn_index=0,
            answer=answer,
            surface="openai-chat",
            expect=turn,
            exposed=frozenset(fixture.tools),
            schemas=schemas,
            proposed=[Proposed(p.call_id, p.tool_name, p.arguments) for p in proposals],
        )
        checks: dict[str, bool] = {}
        for c in model_checks(run):
            checks[c.metric] = checks.get(c.metric, True) and c.passed
        out[fixture.id] = checks
    return out


# Known answers, through the importer, the adapter and the eval's scoring ------------------


def test_a_function_calling_models_right_answers_score_correct(tmp_path: Path) -> None:
    out, said = _import(
        tmp_path,
        FILES / "BFCL_v4_simple_python.json",
        "--results",
        str(FC / "BFCL_v4_simple_python_result.json"),
    )
    assert "callgate eval run" in said
    scored = _scored(load_suite(out), "BFCL_v4_simple_python_result")
    # simple_python_0: exact, optional unit left out; _1: "new york city" / "April 1,2024"
    # normalised; _2: math_hypot (BFCL's underscore spelling) with ints for floats; _3: a
    # dict compared key by key and a list element by element.
    for ident, checks in scored.items():
        assert all(checks.values()), (ident, checks)
    assert set(scored) == {f"simple_python_{i}" for i in range(4)}


def test_a_prompting_models_wrong_value_fails_argument_accuracy_only(tmp_path: Path) -> None:
    out, _ = _import(
        tmp_path,
        FILES / "BFCL_v4_simple_python.json",
        "--results",
        str(PROMPT / "BFCL_v4_simple_python_result.json"),
        "--name",
        "prompted",
    )
    scored = _scored(load_suite(out), "prompted")
    # base=12 where BFCL accepts 10; Boston for New York: the tool was right.
    for ident in ("simple_python_0", "simple_python_1"):
        assert scored[ident]["selection_accuracy"] is True
        assert scored[ident]["argument_validity"] is True
        assert scored[ident]["argument_accuracy"] is False
    assert all(scored["simple_python_2"].values())  # parsed with ast: correct
    # Prose instead of a call: BFCL's decode fails; here, no call where one was due.
    assert scored["simple_python_3"]["selection_accuracy"] is False
    assert scored["simple_python_3"]["argument_accuracy"] is False


def test_a_wrong_tool_fails_selection_on_the_real_extract(tmp_path: Path) -> None:
    results = tmp_path / "BFCL_v4_multiple_result.json"
    results.write_text(
        json.dumps({"id": "multiple_0", "result": [{"circle_properties_get": {"radius": 5}}]})
        + "\n"
        # One file, one convention: a function-calling model's (underscore_to_dot), as the
        # list of calls says; it spells math.triangle_area_heron with underscores.
        + json.dumps(
            {
                "id": "multiple_1",
                "result": [{"math_triangle_area_heron": '{"side1": 3, "side2": 4, "side3": 5}'}],
            }
        )
        + "\n"
    )
    out, said = _import(tmp_path, REAL, "--results", str(results))
    suite = load_suite(out)
    assert len(suite.fixtures) == 120 and {f.category for f in suite.fixtures} == {"multiple"}
    assert "118 questions have no result" in said
    answered = suite.model_copy(
        update={"fixtures": [f for f in suite.fixtures if f.id in ("multiple_0", "multiple_1")]}
    )
    scored = _scored(answered, "BFCL_v4_multiple_result")
    assert scored["multiple_0"]["selection_accuracy"] is False
    assert scored["multiple_0"]["hallucinated_tool_rate"] is True  # offered, just wrong
    assert all(scored["multiple_1"].values())


def test_an_irrelevance_question_answered_with_a_call_fails(tmp_path: Path) -> None:
    out, _ = _import(
        tmp_path,
        FILES / "BFCL_v4_irrelevance.json",
        "--results",
        str(FC / "BFCL_v4_irrelevance_result.json"),
    )
    suite = load_suite(out)
    assert all(f.turns[0].calls == [] for f in suite.fixtures)
    scored = _scored(suite, "BFCL_v4_irrelevance_result")
    assert scored["irrelevance_0"]["irrelevance_accuracy"] is True
    assert scored["irrelevance_1"]["irrelevance_accuracy"] is False


def test_a_parallel_answer_in_another_order_passes(tmp_path: Path) -> None:
    out, _ = _import(
        tmp_path,
        FILES / "BFCL_v4_parallel.json",
        "--results",
        str(FC / "BFCL_v4_parallel_result.json"),
    )
    scored = _scored(load_suite(out), "BFCL_v4_parallel_result")
    assert scored["parallel_0"]["parallel_completeness"] is True
    assert all(scored["parallel_0"].values())


def test_without_results_the_fixtures_wait_for_responses_or_a_live_model(tmp_path: Path) -> None:
    out, said = _import(tmp_path, FILES / "BFCL_v4_simple_python.json")
    assert "--responses" in said and "--live" in said
    suite = load_suite(out)
    assert all(f.turns[0].answers == {} for f in suite.fixtures)
    assert suite.config.tools == "callgate.ops.lab.eval.stubs:registry"
    # --responses: one provider response per fixture, named after BFCL's id.
    folder = tmp_path / "my-model"
    folder.mkdir()
    recorded = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "my-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "calculate_triangle_area",
                                "arguments": '{"base": 10, "height": 5, "unit": "Units"}',
                            },
                        }
                    ],
                },
            }
        ],
    }
    (folder / "simple_python_0.1.openai-chat.json").write_text(json.dumps(recorded))
    answered = with_responses(suite, folder, "my-model")
    only = answered.model_copy(update={"fixtures": [answered.fixtures[0]]})
    assert all(_scored(only, "my-model")["simple_python_0"].values())


# BFCL's value rules, one by one (ast_checker.py) ------------------------------------------


def _spec(kind: str, values: list[Any], items: str | None = None) -> BfclSpec:
    return BfclSpec.model_validate({"type": kind, "values": values, "items": items})


@pytest.mark.parametrize(
    ("kind", "values", "value", "ok"),
    [
        ("string", ["New York City"], "new york city", True),  # case and spaces
        ("string", ["April 1, 2024"], "April 1,2024", True),  # punctuation ,./-_*^
        ("string", ["San-Francisco"], "san_francisco", True),
        ("string", ["Seoul"], "Busan", False),
        ("string", ["Seoul"], 1, False),  # a type BFCL does not accept
        ("float", [3.0], 3, True),  # an int for a float
        ("float", [3.0], 3.5, False),
        ("integer", [10], 10.0, False),  # but never a float for an int
        ("integer", [1], True, False),  # nor a bool
        ("boolean", [True], True, True),
        ("integer", ["x"], "x", True),  # a "variable": the answers' own type
        ("array", [[3, 5, 9]], [3, 5, 9], True),
        ("array", [[3, 5, 9]], [9, 5, 3], False),  # lists compared in order
        ("array", [["Seoul", "Tokyo"]], ["seoul", "TOKYO"], True),  # items normalised
        ("tuple", [[1, 2]], [1, 2], True),
        ("dict", [{"name": ["Alice"], "nights": [2]}], {"name": "alice", "nights": 2}, True),
        ("dict", [{"name": ["Alice"], "nights": [2]}], {"name": "Alice"}, False),
        ("dict", [{"name": ["Alice"], "nights": [2, ""]}], {"name": "Alice"}, True),
        ("dict", [{"name": ["Alice"]}], {"name": "Alice", "pet": "cat"}, False),
        ("any", ["x"], "X", True),
    ],
)
def test_bfcl_value_rules(kind: str, values: list[Any], value: Any, ok: bool) -> None:
    assert bfcl_matches(_spec(kind, values), value) is ok


def test_lists_of_dicts_and_item_types() -> None:
    spec = _spec("array", [[{"a": [1]}, {"a": [2]}]], items="dict")
    assert bfcl_matches(spec, [{"a": 1}, {"a": 2}])
    assert not bfcl_matches(spec, [{"a": 2}, {"a": 1}])
    assert not bfcl_matches(_spec("array", [[1, 2]], items="integer"), ["1", "2"])


def test_standardize_is_bfcls() -> None:
    assert standardize("April 1, 2024") == standardize("april 1 2024") == "april12024"
    assert standardize("It's") == 'it"s'


def test_an_empty_string_among_the_values_makes_the_param_optional(tmp_path: Path) -> None:
    out, _ = _import(tmp_path, FILES / "BFCL_v4_simple_python.json")
    fixture = next(f for f in load_suite(out).fixtures if f.id == "simple_python_2")
    from callgate.ops.lab.eval.matchers import arguments_match

    matchers_ = fixture.turns[0].calls[0].arguments
    assert arguments_match(matchers_, {"x": 3, "y": 4})
    assert not arguments_match(matchers_, {"x": 3})  # y is required
    assert not arguments_match(matchers_, {"x": 3, "y": 4, "w": 1})  # unexpected param


# The stubs are read-only --------------------------------------------------------------------


def test_every_stub_is_a_read_with_no_effects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _ = _import(tmp_path, REAL)
    monkeypatch.setenv(stubs.ENV, str(out / "tools.json"))
    registry = stubs.registry()
    assert len(registry.tools) >= 200
    assert {t.kind for t in registry.tools.values()} == {"read"}
    assert {t.effect for t in registry.tools.values()} == {READ_ONLY}
    assert all(t.resolve is None and t.lookup is None for t in registry.tools.values())


def test_a_name_defined_twice_differently_gets_a_second_name(tmp_path: Path) -> None:
    doc = json.loads((FILES / "BFCL_v4_irrelevance.json").read_text().splitlines()[0])
    other = {**doc, "id": "irrelevance_9"}
    other["function"] = [{**doc["function"][0], "description": "Another definition."}]
    questions = tmp_path / "BFCL_v4_irrelevance.json"
    questions.write_text(json.dumps(doc) + "\n" + json.dumps(other) + "\n")
    out, _ = _import(tmp_path, questions)
    tools = [t["name"] for t in json.loads((out / "tools.json").read_text())]
    assert tools == ["calculate_triangle_area", "calculate_triangle_area__2"]
    assert load_suite(out).fixtures[1].tools == ["calculate_triangle_area__2"]


# Bad input: one line naming file, line and field; nothing written ---------------------------


def test_python_calls_are_parsed_never_run() -> None:
    assert bfcl_decode.decode_prompt("[f(a=1), pkg.g(b='x', c=[1, 2])]") == [
        ("f", {"a": 1}),
        ("pkg.g", {"b": "x", "c": [1, 2]}),
    ]
    # Decoded as BFCL decodes them (a call named ``system``; a call as an argument is its
    # text), and nothing in them runs.
    assert bfcl_decode.decode_prompt("[__import__('os').system('true')]") == [("system", {})]
    assert bfcl_decode.decode_prompt("[f(a=open('x'))]") == [("f", {"a": "open('x')"})]
    assert bfcl_decode.decode_prompt("[f(a=open('x').read() + 'y')]") is None
    assert bfcl_decode.decode_prompt("It is sunny.") is None


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (
            '{"id": "simple_python_0", "ground_truth": {"calculate_triangle_area": {}}}',
            "ground_truth",
        ),
        (
            '{"id": "simple_python_0", '
            '"ground_truth": [{"calculate_triangle_area": {"base": 10}}]}',
            "ground_truth[0].calculate_triangle_area.base",
        ),
        ('{"id": "simple_python_0", "ground_truth": [{"nope": {}}]}', "ground_truth[0]"),
    ],
)
def test_bad_answers_name_file_line_and_field_and_write_nothing(
    tmp_path: Path, line: str, field: str
) -> None:
    questions = tmp_path / "BFCL_v4_simple_python.json"
    questions.write_text((FILES / "BFCL_v4_simple_python.json").read_text().splitlines()[0] + "\n")
    answers = tmp_path / "answers.json"
    answers.write_text("\n" + line + "\n")
    out = tmp_path / "suite"
    ran = CliRunner().invoke(
        eval_group, ["import-bfcl", str(questions), "--answers", str(answers), "--out", str(out)]
    )
    assert ran.exit_code != 0
    assert isinstance(ran.exception, InputError)
    assert ran.exception.code.value == "invalid_input"
    assert f"{answers}:2: field {field}:" in ran.exception.message
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "BFCL_v4_simple_python.json",
        "answers.json",
    ]


def test_an_unknown_category_is_refused(tmp_path: Path) -> None:
    questions = tmp_path / "questions.json"
    questions.write_text('{"id": "java_0", "question": [], "function": []}\n')
    with pytest.raises(InputError, match="--category"):
        bfcl.category_of(questions, ["java_0"])
    assert bfcl.category_of(tmp_path / "BFCL_v4_live_parallel_multiple.json", []) == (
        "live_parallel_multiple"
    )
    assert bfcl.category_of(questions, ["live_simple_0-0-0", "live_simple_1-1-0"]) == "live_simple"
    assert bfcl.category_of(questions, ["parallel_multiple_3"]) == "parallel_multiple"
    assert bfcl.category_of(questions, ["simple_java_0"]) == "simple_java"
    assert bfcl.category_of(questions, ["simple_javascript_0"]) == "simple_javascript"
    assert bfcl.category_of(questions, ["live_relevance_0-0-0"]) == "live_relevance"
    assert bfcl.category_of(tmp_path / "BFCL_v4_simple_java.json", []) == "simple_java"
    for other in ("multi_turn_base_0", "memory_kv_0", "web_search_base_0"):
        with pytest.raises(InputError, match="cannot be imported"):
            bfcl.category_of(questions, [other])
    with pytest.raises(InputError, match="cannot be imported"):
        bfcl.category_of(tmp_path / "BFCL_v4_multi_turn_base.json", [])


def test_a_question_offering_no_function_imports(tmp_path: Path) -> None:
    """BFCL's live irrelevance has questions with ``"function": []``."""
    questions = tmp_path / "BFCL_v4_live_irrelevance.json"
    questions.write_text(
        '{"id": "live_irrelevance_120-9-0", "question": [[{"role": "user", "content": '
        '"Weather in Boston?"}]], "function": []}\n'
    )
    out, _ = _import(tmp_path, questions)
    (fixture,) = load_suite(out).fixtures
    assert fixture.category == "irrelevance" and fixture.tools == []


@pytest.mark.parametrize(
    ("file", "ids", "named"),
    [
        ("BFCL_v4_multi_turn_base.json", [], "multi_turn_base"),
        ("BFCL_v4_memory_kv.json", [], "memory_kv"),
        ("BFCL_v4_web_search_base.json", [], "web_search_base"),
        (
            "questions.json",
            ["multi_turn_long_context_0", "multi_turn_long_context_1"],
            "multi_turn",
        ),
    ],
)
def test_an_unsupported_category_is_named_with_why(
    tmp_path: Path, file: str, ids: list[str], named: str
) -> None:
    with pytest.raises(InputError) as refused:
        bfcl.category_of(tmp_path / file, ids)
    assert f"BFCL's {named} category cannot be imported (" in refused.value.message
    assert "--category" not in refused.value.message
