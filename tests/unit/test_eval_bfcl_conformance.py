"""``import-bfcl`` scores as BFCL's own checker does. Pure: no services, no bfcl-eval.

``tests/fixtures/bfcl/conformance/verdicts.json`` holds generated answers (right ones and the
mutations a model makes: arithmetic, bare names, tuples, code fences, the other naming
convention, reordered parallel calls, missing and extra parameters, prose; Java and
JavaScript values spelled right and wrong; calls and no calls for relevance) to questions of
thirteen BFCL v4 categories, each with the verdict BFCL's real checker (bfcl-eval 2026.3.23)
gave it; its README says how it was produced. Every case must get the same verdict here.

``python tests/unit/test_eval_bfcl_conformance.py FILE`` prints the agreement on another
file of that format (a larger one from the README's generate.py), with the disagreements.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from callgate.ops.lab.eval import bfcl, bfcl_decode
from callgate.ops.lab.eval.bfcl_decode import Style
from callgate.ops.lab.eval.fixture import ExpectedCall, Fixture
from callgate.ops.lab.eval.matchers import BfclSpec, bfcl_matches
from callgate.ops.lab.eval.scoring import Check, Proposed, TurnRun, match_calls, model_checks
from callgate.ops.lab.eval.surfaces import mentioned_names
from callgate.producer import adapters
from callgate.producer.adapters.base import AdapterError

VERDICTS = Path(__file__).parents[1] / "fixtures" / "bfcl" / "conformance" / "verdicts.json"


def callgate_verdict(
    category: str,
    question: dict[str, Any],
    ground_truth: list[Any],
    result: Any,
    style: Style,
) -> bool:
    """Whether the model's ``result`` passes, as ``eval run`` scores the imported fixture:
    irrelevance accuracy for an irrelevance question, relevance accuracy for a relevance
    one, else the selection and every argument-accuracy check (BFCL's one verdict per
    entry)."""
    ident = question["id"]
    answers = [bfcl.Line(Path("answers.json"), 1, {"id": ident, "ground_truth": ground_truth})]
    imported = bfcl.build(
        "conformance",
        category,
        [bfcl.Line(Path("questions.json"), 1, question)],
        answers if ground_truth else [],
        [bfcl.Line(Path("results.json"), 1, {"id": ident, "result": result})],
        "model",
        style,
    )
    checks = imported_checks(imported)
    fixture = Fixture.model_validate(imported.fixtures[0])
    if fixture.category == "irrelevance":
        wanted = {"irrelevance_accuracy"}
    elif category in bfcl.RELEVANCE:
        wanted = {"relevance_accuracy"}
    else:
        wanted = {"selection_accuracy", "argument_accuracy", "parallel_completeness"}
    verdicts = [c.passed for c in checks if c.metric in wanted]
    assert verdicts, f"no {wanted} check for {ident}"
    return all(verdicts)


def imported_checks(imported: bfcl.Imported) -> list[Check]:
    """The model's checks of an imported one-question suite, as ``eval run`` scores its
    recorded answer."""
    fixture = Fixture.model_validate(imported.fixtures[0])
    schemas = {t["name"]: t["parameters"] for t in imported.tools}
    turn = fixture.turns[0]
    response = turn.answers["model"]["openai-chat"]
    known = set(schemas) | set(fixture.tools) | mentioned_names("openai-chat", response)
    run = TurnRun(
        fixture_id=fixture.id,
        category=fixture.category,
        turn_index=0,
        answer="model",
        surface="openai-chat",
        expect=turn,
        exposed=frozenset(fixture.tools),
        schemas=schemas,
        proposed=(),
    )
    try:
        proposals = adapters.read_proposals("openai-chat", response, known)
    except AdapterError as exc:
        run = replace(run, read_error=str(exc))
    else:
        proposed = [Proposed(p.call_id, p.tool_name, p.arguments) for p in proposals]
        run = replace(run, proposed=proposed)
    return model_checks(run)


def load_cases(path: Path = VERDICTS) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    return [
        {**c, "question": doc["questions"][c["id"]], "ground_truth": doc["answers"].get(c["id"])}
        for c in doc["cases"]
    ]


CASES = load_cases()


def test_the_verdicts_cover_thirteen_categories_and_both_outcomes() -> None:
    assert len({c["category"] for c in CASES}) == 13
    for category in ("simple_java", "simple_javascript", "live_relevance"):
        assert {c["bfcl"] for c in CASES if c["category"] == category} == {True, False}
    assert {c["style"] for c in CASES} == {"prompt", "fc", "fc-underscore"}


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c['id']}:{c['style']}:{c['kind']}:{i}" for i, c in enumerate(CASES)]
)
def test_every_verdict_is_bfcls(case: dict[str, Any]) -> None:
    got = callgate_verdict(
        case["category"],
        case["question"],
        case["ground_truth"] or [],
        case["result"],
        case["style"],
    )
    assert got is case["bfcl"], case["result"]


# The decoder, case by case (BFCL's resolve_ast_by_type) ----------------------------------


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("[f(a=1), pkg.g(b='x')]", [("f", {"a": 1}), ("pkg.g", {"b": "x"})]),
        ("f(a=1)", [("f", {"a": 1})]),  # wrapped in [...] as BFCL does
        ("```\n[f(a=1)]\n```", [("f", {"a": 1})]),  # backticks and newlines stripped
        ("[f(a=2*3, b=2+3, c=7/2, d=2**3)]", [("f", {"a": 6, "b": 5, "c": 3.5, "d": 8})]),
        ("[f(a='x' + 'y', b=[1] * 2)]", [("f", {"a": "xy", "b": [1, 1]})]),
        ("[f(a=-5, b=+5, c=-2.5)]", [("f", {"a": -5, "b": -5, "c": -2.5})]),  # BFCL negates
        ("[f(a=Boston)]", [("f", {"a": "Boston"})]),  # a bare name is its text
        ("[f(a=(1, 2))]", [("f", {"a": (1, 2)})]),  # a tuple stays a tuple
        ("[f(a={'k': [1, None, True]})]", [("f", {"a": {"k": [1, None, True]}})]),
        ("[f(a=g(1))]", [("f", {"a": "g(1)"})]),  # a call without keywords is its text
        ("[f(a=g(x=1))]", [("f", {"a": {"g": {"x": 1}}})]),
        ("[f(a=x[0])]", [("f", {"a": "x[0]"})]),
        ("[f(1, a=2)]", [("f", {"a": 2})]),  # positional arguments are ignored
        ("[f(**{'a': 1})]", [("f", {"**": {"a": 1}})]),
        ("[f(a=...)]", [("f", {"a": "..."})]),
        ("[f(a=1, a=2)]", [("f", {"a": 2})]),  # the last one given wins
        (r"[f(a='\d')]", [("f", {"a": "\\d"})]),  # an invalid escape only warns
        ("[__import__('os').system('true')]", [("system", {})]),  # decoded, never run
    ],
)
def test_prompt_answers_decode_as_bfcls_do(text: str, calls: list[Any]) -> None:
    assert bfcl_decode.decode_prompt(text) == calls


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny.",
        "```python\n[f(a=1)]\n```",  # BFCL reads "python" as part of the call list
        "[f(a=x + 1)]",  # eval would look the name up: NameError
        "[f(a=len('ab') + 1)]",  # a call inside arithmetic is never run
        "[f(a=1/0)]",
        "[f(a=9**9**9)]",  # too large to build
        "[f(a='x' * 10**9)]",
        "[f(a=-x)]",  # BFCL negates only a constant
        "[f(a=-'x')]",
        "[f(a=lambda: 1)]",
        "[f(a=f'{x}')]",
        "[f(a={1, 2})]",
        "[f(a=1 < 2)]",
        "[f(a={**b})]",
        "[f(a=1)], [g(b=2)]",
        "[1, f(a=1)]",
    ],
)
def test_undecodable_answers_are_no_call(text: str) -> None:
    assert bfcl_decode.decode_prompt(text) is None


def test_function_calling_results_decode_as_bfcls_handlers_do() -> None:
    assert bfcl_decode.decode_fc([{"f": '{"a": 1}'}, {"g": {"b": 2}}]) == [
        ("f", {"a": 1}),
        ("g", {"b": 2}),
    ]
    assert bfcl_decode.decode_fc("[f(a=1)]") is None  # text: BFCL's FC decoder fails
    assert bfcl_decode.decode_fc([{"f": "not json"}]) is None
    assert bfcl_decode.decode_fc([{"f": "[1]"}]) is None  # not BFCL's calling format
    assert bfcl_decode.decode("[]", "prompt") is None  # no call
    assert bfcl_decode.decode([{"f": "{}"}], "prompt") is None  # a prompt decoder on a list


def test_names_follow_the_models_convention() -> None:
    assert bfcl_decode.visible_name("math.hypot", "fc-underscore") == "math_hypot"
    assert bfcl_decode.visible_name("math.hypot", "fc") == "math.hypot"
    assert bfcl_decode.visible_name("math.hypot", "prompt") == "math.hypot"
    assert bfcl.style_of([bfcl.Line(Path("r"), 1, {"id": "x", "result": [{"f": "{}"}]})]) == (
        "fc-underscore"
    )
    assert bfcl.style_of([bfcl.Line(Path("r"), 1, {"id": "x", "result": "[f()]"})]) == "prompt"


def test_values_json_cannot_carry_fail_as_in_bfcl() -> None:
    assert bfcl_decode.to_json((1, 2), "tuple") == [1, 2]  # BFCL converts it for a tuple
    odd = [(1, 2), [(1, 2)], {1: "a"}, b"x", 1j, float("inf"), {"k": {1, 2}}, "\ud800"]
    for value in odd:
        marked = bfcl_decode.to_json(value, "array")
        assert set(marked) == {bfcl_decode.UNREPRESENTABLE}
        for kind in ("array", "dict", "string", "any"):
            assert not bfcl_matches(
                BfclSpec.model_validate({"type": kind, "values": [[1, 2], {"1": ["a"]}, "x"]}),
                marked,
            )


def test_a_parameter_the_definition_lacks_never_passes_given() -> None:
    spec = BfclSpec.model_validate({"type": "any", "values": ["x", ""], "declared": False})
    assert not bfcl_matches(spec, "x")


def test_greedy_matching_is_bfcls() -> None:
    """BFCL's parallel matcher takes, for each possible answer in order, the first call left
    that passes it; a later answer can then find nothing although an assignment exists."""
    loose = ExpectedCall.model_validate({"name": "f", "arguments": {"a": {"any": True}}})
    tight = ExpectedCall.model_validate({"name": "f", "arguments": {"a": 1}})
    calls = [Proposed("c1", "f", {"a": 1}), Proposed("c2", "f", {"a": 2})]
    assert match_calls([loose, tight], calls, ordered=False) == {0: 1, 1: 0}
    assert match_calls([loose, tight], calls, ordered=False, greedy=True) == {0: 0}
    assert match_calls([tight, loose], calls, ordered=False, greedy=True) == {0: 0, 1: 1}


def agreement(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """How many cases of a verdicts file agree with BFCL, and the ones that do not."""
    cases = load_cases(path)
    wrong = [
        c
        for c in cases
        if callgate_verdict(
            c["category"], c["question"], c["ground_truth"] or [], c["result"], c["style"]
        )
        is not c["bfcl"]
    ]
    return len(cases) - len(wrong), wrong


if __name__ == "__main__":
    import sys

    source = Path(sys.argv[1]) if len(sys.argv) > 1 else VERDICTS
    agreed, disagreed = agreement(source)
    total = agreed + len(disagreed)
    print(f"{agreed}/{total} verdicts agree with BFCL's ({100 * agreed / total:.2f}%)")
    counts: dict[str, list[int]] = {}
    for c in load_cases(source):
        counts.setdefault(c["category"], [0, 0])[1] += 1
    for c in disagreed:
        counts[c["category"]][0] -= 1
    for category, (minus, n) in sorted(counts.items()):
        print(f"  {category}: {n + minus}/{n}")
    for c in disagreed:
        print(f"  {c['id']} {c['style']} {c['kind']}: BFCL {c['bfcl']}; {c['result']!r}")


def test_a_call_with_no_name_is_still_a_call() -> None:
    """BFCL names ``a[0](x=1)`` ``""``: a call (irrelevance fails), of no offered function."""
    question = {
        "id": "irrelevance_0",
        "question": [[{"role": "user", "content": "?"}]],
        "function": [{"name": "f", "parameters": {"type": "dict", "properties": {}}}],
    }
    assert bfcl_decode.decode_prompt("[a[0](x=1)]") == [("", {"x": 1})]
    assert not callgate_verdict("irrelevance", question, [], "[a[0](x=1)]", "prompt")
    assert callgate_verdict("irrelevance", question, [], "[a[0](x=1)", "fc-underscore")
