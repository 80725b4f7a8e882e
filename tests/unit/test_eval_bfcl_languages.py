"""BFCL's Java, JavaScript and relevance categories in ``import-bfcl``. Pure: no services.

The conversions asserted here are the ones BFCL's own converters document
(``java_type_converter.py`` and ``js_type_converter.py`` in bfcl-eval 2026.3.23, their test
functions), quirks included; the verdicts on whole answers are checked against BFCL's in
test_eval_bfcl_conformance.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from callgate.core.errors import InputError
from callgate.ops.lab.eval import bfcl, bfcl_decode
from callgate.ops.lab.eval.bfcl_decode import Unconvertible, convert
from callgate.ops.lab.eval.cli import eval_group
from callgate.ops.lab.eval.fixture import ExpectedCall, Fixture, load_suite
from callgate.ops.lab.eval.matchers import Bfcl, BfclSpec, bfcl_matches
from callgate.ops.lab.eval.scoring import ANY_CALL, Proposed, match_calls
from tests.unit.test_eval_bfcl_conformance import imported_checks

JAVA_QUESTION: dict[str, Any] = {
    "id": "simple_java_1",
    "question": [[{"role": "user", "content": "Proposals for Customers, short names."}]],
    "function": [
        {
            "name": "SQLCompletionAnalyzer.makeProposalsFromObject",
            "description": "Generates SQL completion proposals.",
            "parameters": {
                "type": "dict",
                "properties": {
                    "object": {"type": "any", "description": "The database object."},
                    "useShortName": {"type": "boolean", "description": "Short names."},
                    "params": {"type": "HashMap", "description": "More parameters."},
                    "ids": {
                        "type": "ArrayList",
                        "description": "Ids.",
                        "items": {"type": "long"},
                    },
                },
                "required": ["object", "useShortName", "params"],
            },
        }
    ],
}
JAVA_TRUTH = [
    {
        "SQLCompletionAnalyzer.makeProposalsFromObject": {
            "object": ["Customers"],
            "useShortName": [True],
            "params": [{"limit": [50], "schemaFilter": ["public"]}],
            "ids": [[101, 202], ""],
        }
    }
]


@pytest.mark.parametrize(
    ("text", "kind", "items", "value"),
    [
        ("true", "boolean", None, True),
        ("123", "integer", None, 123),
        ("-123", "integer", None, -123),
        ("3.14f", "float", None, 3.14),
        ("3e-3F", "float", None, 3e-3),
        ("3.14", "double", None, 3.14),
        ("123L", "long", None, 123),
        ("127", "byte", None, 127),
        ("new int[]{1, 2, 3}", "Array", "integer", [1, 2, 3]),
        ("new int[] { }", "Array", "integer", []),
        ("new long[]{1L, 2, 3L}", "Array", "long", [1, "2", 3]),  # 2 is no long: text
        ('new ArrayList<>(Arrays.asList("a", "b"))', "ArrayList", "String", ["a", "b"]),
        ("new ArrayList<Float>() {{ add(1.0f); add(2.0f); }}", "ArrayList", "float", [1.0, 2.0]),
        ("new ArrayList<>()", "ArrayList", "integer", []),
        (
            'new HashMap<String, Object>() {{ put("key1", 1); put("key2", "value"); }}',
            "HashMap",
            None,
            {"key1": 1, "key2": "value"},
        ),
        ("new HashMap<>() {{ }}", "HashMap", None, {}),
        ("abc", "String", None, "abc"),
        ("123", "any", None, "123"),
        # Text that fits no pattern of the type stays text.
        ("3.14", "float", None, "3.14"),  # a Java float needs its f
        ("123", "long", None, "123"),  # a long needs its L
        ("True", "boolean", None, "True"),
        # BFCL's quirks, as its converter has them.
        ('new String[]{"a", "b"}', "Array", "String", ['"a"', '"b"']),  # quotes kept
        ("'a'", "char", None, "'a'"),  # its char pattern never matches
    ],
)
def test_java_text_converts_as_bfcls_converter_does(
    text: str, kind: str, items: str | None, value: Any
) -> None:
    assert convert("java", text, kind, items) == value


@pytest.mark.parametrize(
    ("text", "kind", "items", "value"),
    [
        ("true", "Boolean", None, True),
        ("123", "integer", None, 123),
        ("3.14", "float", None, 3.14),
        ("123n", "Bigint", None, 123),
        ("'abc'", "String", None, "abc"),  # quotes stripped
        ('"abc"', "String", None, "abc"),
        ("abc", "String", None, "abc"),
        ("[1, 2, 3]", "array", "integer", [1, 2, 3]),
        ("new Array(4.4, 5.5)", "array", "float", [4.4, 5.5]),
        ('["hello", "world"]', "array", "String", ["hello", "world"]),
        ("[1, 'two', true]", "array", None, [1, "two", True]),
        (" [ [ 1, 2 ], [ 3,   4]]", "array", "array", [[1, 2], [3, 4]]),
        ("{'key': 123}", "dict", None, {"key": 123}),
        ("{}", "dict", None, {}),
        (
            '{"a": x, "b": ["m"]}',
            "dict",
            None,
            {"a": "x", "b": ["m"]},
        ),
        # Patterns are matched at the start only: what follows the value is ignored.
        ('{"k": "v"} and more', "dict", None, {"k": "v"}),
        ("1e5", "float", None, "1e5"),  # no exponent in a JavaScript float's pattern
    ],
)
def test_javascript_text_converts_as_bfcls_converter_does(
    text: str, kind: str, items: str | None, value: Any
) -> None:
    assert convert("javascript", text, kind, items) == value


def test_types_bfcl_cannot_convert_are_unconvertible() -> None:
    for kind in ("Set", "Hashtable", "Queue", "Stack", "Vector"):
        with pytest.raises(Unconvertible):
            convert("java", "x", kind)
    with pytest.raises(Unconvertible):
        convert("javascript", "x", "Map")


def _java(kind: str, values: list[Any], items: str | None = None) -> BfclSpec:
    return BfclSpec.model_validate(
        {"type": kind, "items": items, "values": values, "language": "java"}
    )


def test_a_java_argument_is_text_converted_before_it_is_checked() -> None:
    assert bfcl_matches(_java("integer", [50]), "50")
    assert not bfcl_matches(_java("integer", [50]), 50)  # not text: BFCL's type_error:java
    assert bfcl_matches(_java("long", [42]), "42L")
    assert bfcl_matches(_java("boolean", [True]), "true")
    assert not bfcl_matches(_java("boolean", [True]), "True")
    hashmap = [{"limit": [50], "schemaFilter": ["public"]}]
    text = 'new HashMap<String, Object>() {{ put("limit", 50); put("schemaFilter", "public"); }}'
    assert bfcl_matches(_java("HashMap", hashmap), text)
    assert not bfcl_matches(_java("HashMap", hashmap), text.replace("50", "51"))
    assert bfcl_matches(
        _java("ArrayList", [[101, 202]], "long"), "new ArrayList<Long>(Arrays.asList(101L, 202L))"
    )
    assert not bfcl_matches(_java("Set", ["x"]), "x")  # BFCL's checker crashes: no pass
    # A Python int is never taken for a Java float: text that is not a float stays text.
    assert not bfcl_matches(_java("float", [3.0]), "3")


def test_a_spec_names_only_its_languages_types() -> None:
    with pytest.raises(ValueError, match="java types"):
        _java("string", ["x"])
    with pytest.raises(ValueError, match="python types"):
        BfclSpec.model_validate({"type": "HashMap", "values": []})


def _build(
    category: str,
    question: dict[str, Any],
    truth: list[Any],
    result: Any,
    style: bfcl_decode.Style,
) -> bfcl.Imported:
    return bfcl.build(
        "t",
        category,
        [bfcl.Line(Path("q.json"), 1, question)],
        [bfcl.Line(Path("a.json"), 1, {"id": question["id"], "ground_truth": truth})],
        [bfcl.Line(Path("r.json"), 1, {"id": question["id"], "result": result})],
        "model",
        style,
    )


def test_a_java_function_is_shown_as_bfcl_shows_it_and_checked_in_java() -> None:
    imported = _build("simple_java", JAVA_QUESTION, JAVA_TRUTH, [], "fc-underscore")
    (tool,) = imported.tools
    assert tool["name"] == "SQLCompletionAnalyzer_makeProposalsFromObject"
    props = tool["parameters"]["properties"]
    assert {p["type"] for p in props.values()} == {"string"}  # text of the declared type
    assert "items" not in props["ids"]
    assert "Java long" not in props["ids"]["description"]
    assert "elements are of type long" in props["ids"]["description"]
    assert "Java HashMap type parameter" in props["params"]["description"]
    assert "Java 8 SDK syntax" in tool["description"]
    assert JAVA_QUESTION["function"][0]["parameters"]["properties"]["ids"]["items"]  # untouched
    fixture = Fixture.model_validate(imported.fixtures[0])
    (call,) = fixture.turns[0].calls
    specs = {k: m.bfcl for k, m in call.arguments.items() if isinstance(m, Bfcl)}
    assert specs.keys() == call.arguments.keys()
    assert {s.language for s in specs.values()} == {"java"}
    assert specs["ids"].items == "long"


def test_a_prompting_models_java_answers_are_refused_with_the_way_out() -> None:
    with pytest.raises(InputError, match="--model-style fc") as refused:
        _build("simple_java", JAVA_QUESTION, JAVA_TRUTH, "[f(a=1)]", "prompt")
    assert "tree-sitter" in refused.value.message


def test_an_array_without_an_item_type_is_refused() -> None:
    question = json.loads(json.dumps(JAVA_QUESTION))
    del question["function"][0]["parameters"]["properties"]["ids"]["items"]
    with pytest.raises(InputError, match="ids: ArrayList needs an item type"):
        _build("simple_java", question, JAVA_TRUTH, [], "fc")


RELEVANCE_QUESTION: dict[str, Any] = {
    "id": "live_relevance_0-0-0",
    "question": [[{"role": "user", "content": "Find me a painting."}]],
    "function": [
        {
            "name": "search_engine.query",
            "description": "Search.",
            "parameters": {
                "type": "dict",
                "properties": {"prompt": {"type": "string", "description": "What."}},
                "required": ["prompt"],
            },
        }
    ],
}


def _relevance_checks(result: Any, style: bfcl_decode.Style) -> dict[str, bool]:
    imported = _build("live_relevance", RELEVANCE_QUESTION, [], result, style)
    return {c.metric: c.passed for c in imported_checks(imported)}


def test_relevance_passes_on_any_call_and_only_on_a_call() -> None:
    assert _relevance_checks("[search_engine.query(prompt='painting')]", "prompt") == {
        "hallucinated_tool_rate": True,
        "argument_validity": True,
        "relevance_accuracy": True,
    }
    # Any call counts, whatever its name or arguments (BFCL asks only that one was made).
    other = _relevance_checks([{"no_such_function": "{}"}], "fc-underscore")
    assert other["relevance_accuracy"] and not other["hallucinated_tool_rate"]
    no_calls: list[tuple[Any, bfcl_decode.Style]] = [
        ("I cannot help.", "prompt"),
        ("[]", "prompt"),
        ([], "fc"),
    ]
    for no_call, style in no_calls:
        assert _relevance_checks(no_call, style) == {"relevance_accuracy": False}


def test_a_relevance_fixture_expects_any_call() -> None:
    imported = _build("live_relevance", RELEVANCE_QUESTION, [], [], "fc")
    fixture = Fixture.model_validate(imported.fixtures[0])
    assert fixture.category == "multiple"
    assert [c.name for c in fixture.turns[0].calls] == [ANY_CALL]
    wildcard = ExpectedCall.model_validate({"name": ANY_CALL})
    calls = [Proposed("c1", "anything", {"x": 1}), Proposed("c2", "other", "not json")]
    assert match_calls([wildcard], calls, ordered=False) == {0: 0}
    assert match_calls([wildcard], [], ordered=False) == {}


def test_import_bfcl_takes_live_relevance_without_possible_answers(tmp_path: Path) -> None:
    questions = tmp_path / "BFCL_v4_live_relevance.json"
    questions.write_text(json.dumps(RELEVANCE_QUESTION) + "\n")
    results = tmp_path / "model.json"
    results.write_text(json.dumps({"id": RELEVANCE_QUESTION["id"], "result": "[]"}) + "\n")
    out = tmp_path / "suite"
    ran = CliRunner().invoke(
        eval_group,
        ["import-bfcl", str(questions), "--out", str(out), "--results", str(results)],
        catch_exceptions=False,
    )
    assert ran.exit_code == 0, ran.output
    (fixture,) = load_suite(out).fixtures
    assert [c.name for c in fixture.turns[0].calls] == [ANY_CALL]
