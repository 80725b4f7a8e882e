"""``callgate eval bfcl-multi-turn``'s verdicts against BFCL's own, and its guard against a
hostile results file, with BFCL's code from the ``bfcl-eval`` wheel (fetched without its
dependencies, as tests/integration/test_bfcl_eval_conformance.py does).

The reference is BFCL's evaluation as shipped: ``_evaluate_single_multi_turn_entry`` taken by
name from ``eval_checker/eval_runner.py``, given a handler whose ``decode_execute`` is the
OpenAI/Claude handlers' (``convert_to_function_call`` for function calling,
``default_decode_execute_prompting`` for prompting), those decoders taken by name from
``model_handler/utils.py`` with Python's own ``eval``, and BFCL's ``multi_turn_checker``. The
entries are held out: none is in tests/fixtures/bfcl/multi_turn, and they are spread over the
four multi-turn categories. Each is answered in both styles and twelve ways (the ground
truth, and mutations a model makes or a decoder may get wrong), and callgate's verdict must
be BFCL's on every one. No services: the model's verdict is BFCL's checker in this process.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from callgate.ops.lab.eval import bfcl_multi_turn as multi_turn
from callgate.ops.lab.eval import bfcl_multi_turn_backend as backend
from callgate.ops.lab.eval import bfcl_multi_turn_decode as decode
from tests.integration import bfcl_wheel

FIXTURES = Path(__file__).parents[1] / "fixtures" / "bfcl" / "multi_turn"
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
PLACES = (7, 61, 118, 173)  # entries spaced through each file; the fixtures hold others
PROSE = "I have done what you asked."
Answer = list[tuple[str, dict[str, Any]]]  # a turn's calls: name, keyword arguments


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    unpacked = bfcl_wheel.fetch(tmp_path_factory.mktemp("bfcl"))
    backend.use(unpacked)
    return unpacked


class Reference:
    """BFCL's evaluation of one multi-turn entry, its own code with its own ``eval``."""

    def __init__(self, wheel: Path) -> None:
        utils = wheel / "bfcl_eval" / "model_handler" / "utils.py"
        runner = wheel / "bfcl_eval" / "eval_checker" / "eval_runner.py"
        from bfcl_eval.constants.enums import ReturnFormat  # type: ignore[import-not-found]

        self.ns: dict[str, Any] = {"ast": ast, "json": json, "re": __import__("re")}
        self.ns.update(ReturnFormat=ReturnFormat, BaseHandler=object)
        self.ns["multi_turn_checker"] = backend.checker().multi_turn_checker
        self.ns["is_empty_execute_response"] = backend.utils().is_empty_execute_response
        self._take(utils, set(backend.DECODERS))
        self._take(runner, {"_evaluate_single_multi_turn_entry"})

    def _take(self, path: Path, names: set[str]) -> None:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                exec(compile(ast.Module([node], []), str(path), "exec"), self.ns)

    def verdict(self, entry: multi_turn.Entry, style: str) -> tuple[bool, str | None]:
        ns = self.ns

        class Handler:  # BFCL's OpenAI and Claude handlers' decode_execute, as written
            def decode_execute(self, result: Any, has_tool_call_tag: bool) -> Any:
                if style == "fc":
                    return ns["convert_to_function_call"](result)
                return ns["default_decode_execute_prompting"](result, has_tool_call_tag)

        model = f"reference_{uuid.uuid4().hex[:8]}"
        try:
            found = ns["_evaluate_single_multi_turn_entry"](
                Handler(),
                entry.id,
                entry.result,
                entry.ground_truth,
                dict(entry.doc),
                model,
                entry.category,
            )
        finally:
            multi_turn._forget(model)
        if found["valid"]:
            return True, None
        return False, str(found["error"]["error_type"])


def _held_out() -> list[tuple[dict[str, Any], list[list[str]]]]:
    kept = {json.loads(line)["id"] for line in (FIXTURES / "BFCL_v4_multi_turn_base.json").open()}
    data = backend.root() / "bfcl_eval" / "data"
    out = []
    for category in CATEGORIES:
        name = f"BFCL_v4_multi_turn_{category}.json"
        questions = [json.loads(line) for line in (data / name).open()]
        truths = {
            d["id"]: d["ground_truth"]
            for d in map(json.loads, (data / "possible_answer" / name).open())
        }
        for place in PLACES:
            question = questions[place]
            usable = not any(backend.missing(c) for c in question["involved_classes"])
            if question["id"] not in kept and usable:
                out.append((question, truths[question["id"]]))
    return out


def _answers(question: dict[str, Any], truth: list[list[str]]) -> list[Answer]:
    """Each turn's ground truth as keyword calls (a positional one named by the method)."""
    instances = [getattr(backend.module_of(c), c)() for c in question["involved_classes"]]
    turns = []
    for turn in truth:
        calls = []
        for text in turn:
            call = decode.parse_call(text)
            method = next(getattr(i, call.name) for i in instances if hasattr(i, call.name))
            bound = inspect.signature(method).bind_partial(*call.positional, **call.arguments)
            calls.append((call.name, dict(bound.arguments)))
        turns.append(calls)
    return turns


def _call(name: str, args: dict[str, Any], shown: Callable[[str, Any], str] | None = None) -> str:
    show = shown or (lambda _, v: repr(v))
    return f"{name}({', '.join(f'{k}={show(k, v)}' for k, v in args.items())})"


def _text(calls: Answer) -> str:
    return "[" + ", ".join(_call(n, a) for n, a in calls) + "]"


def _rewritten(turns: list[Answer], plain: list[list[Any]], t: int, c: int, text: str) -> Any:
    """``plain`` with call ``c`` of turn ``t`` written as ``text``."""
    written = [text if i == c else _call(n, a) for i, (n, a) in enumerate(turns[t])]
    changed = [list(s) for s in plain]
    changed[t][0] = "[" + ", ".join(written) + "]"
    return changed


def _fc(calls: Answer) -> list[dict[str, str]]:
    return [{n: json.dumps(a)} for n, a in calls]


def _result(turns: list[Answer], style: str, per_step: bool = False) -> list[list[Any]]:
    write: Callable[[Answer], Any] = _fc if style == "fc" else _text
    out: list[list[Any]] = []
    for calls in turns:
        if not calls:
            out.append([PROSE])
            continue
        groups = [[c] for c in calls] if per_step else [calls]
        out.append([*(write(g) for g in groups), PROSE])
    return out


def _first(turns: list[Answer], has: Callable[[str, dict[str, Any]], bool]) -> tuple[int, int]:
    for t, calls in enumerate(turns):
        for c, (name, args) in enumerate(calls):
            if has(name, args):
                return t, c
    return -1, -1


def _variants(turns: list[Answer], style: str) -> dict[str, Any]:
    """The answers of one entry in one style: the kind → a results file's ``result``."""
    out: dict[str, Any] = {"truth": _result(turns, style)}
    out["one_call_a_step"] = _result(turns, style, per_step=True)
    t, c = _first(turns, lambda _, a: any(isinstance(v, str) for v in a.values()))
    if t >= 0:
        changed = [list(x) for x in turns]
        name, args = changed[t][c]
        key = next(k for k, v in args.items() if isinstance(v, str))
        changed[t][c] = (name, {**args, key: args[key] + "_x"})
        out["wrong_value"] = _result(changed, style)
    last = max(i for i, calls in enumerate(turns) if calls)
    out["drop_call"] = _result([*turns[:last], turns[last][:-1], *turns[last + 1 :]], style)
    first = min(i for i, calls in enumerate(turns) if calls)
    repeated = [*turns[:first], [turns[first][0], *turns[first]], *turns[first + 1 :]]
    out["extra_call"] = _result(repeated, style)
    renamed = [list(x) for x in turns]
    renamed[first][0] = (renamed[first][0][0] + "_v2", renamed[first][0][1])
    out["unknown_function"] = _result(renamed, style)
    out["prose_turn"] = [
        *_result(turns[:first], style),
        [PROSE],
        *_result(turns[first + 1 :], style),
    ]
    out["turn_missing"] = _result(turns[:-1], style)
    plain = _result(turns, style)
    if style == "prompt":
        out.update(_prompt_only(turns, plain, first))
    else:
        out.update(_fc_only(turns, plain, first))
    return out


def _prompt_only(turns: list[Answer], plain: list[list[Any]], first: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # BFCL keeps keyword arguments only: a positional one is dropped.
    t, c = _first(turns, lambda _, a: bool(a))
    name, args = turns[t][c]
    key, *_ = args
    rest = [f"{k}={v!r}" for k, v in args.items() if k != key]
    out["positional"] = _rewritten(
        turns, plain, t, c, f"{name}({', '.join([repr(args[key]), *rest])})"
    )
    fenced = [list(s) for s in plain]
    fenced[first][0] = f"```python\n{fenced[first][0]}\n```"
    out["fenced"] = fenced
    # A number written +N: BFCL negates it.
    t, c = _first(turns, lambda _, a: any(type(v) in (int, float) for v in a.values()))
    if t >= 0:
        name, args = turns[t][c]
        key = next(k for k, v in args.items() if type(v) in (int, float))
        signed = _call(name, args, lambda k, v: f"+{v!r}" if k == key else repr(v))
        out["unary_plus"] = _rewritten(turns, plain, t, c, signed)
    # A string argument written as a sum: BFCL's decoder evaluates it.
    t, c = _first(turns, lambda _, a: any(type(v) is str and len(v) > 1 for v in a.values()))
    if t >= 0:
        name, args = turns[t][c]
        key = next(k for k, v in args.items() if type(v) is str and len(v) > 1)
        summed = _call(name, args, lambda k, v: f"{v[:1]!r} + {v[1:]!r}" if k == key else repr(v))
        out["arithmetic"] = _rewritten(turns, plain, t, c, summed)
    return out


def _fc_only(turns: list[Answer], plain: list[list[Any]], first: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # A turn written as Python text: BFCL's function-calling decoder cannot read it.
    as_text = [list(s) for s in plain]
    as_text[first][0] = _text(turns[first])
    out["turn_as_text"] = as_text
    objects = [list(s) for s in plain]
    objects[first][0] = [{n: a} for n, a in turns[first]]  # arguments as objects, not JSON text
    out["arguments_as_objects"] = objects
    t, c = _first(turns, lambda _, a: any(type(v) in (int, float) for v in a.values()))
    if t >= 0:
        name, args = turns[t][c]
        strings = [list(s) for s in plain]
        strings[t][0] = [{name: json.dumps({k: str(v) for k, v in args.items()})}]
        out["numbers_as_strings"] = strings
    bad = [list(s) for s in plain]
    bad[first][0] = [{turns[first][0][0]: "{not json"}]
    out["arguments_not_json"] = bad
    return out


def test_every_multi_turn_verdict_is_bfcls_on_held_out_entries(wheel: Path) -> None:
    reference = Reference(wheel)
    held_out = _held_out()
    assert len(held_out) >= 12, [q["id"] for q, _ in held_out]
    seen: dict[tuple[str, str], set[bool]] = {}
    disagreed = []
    for question, truth in held_out:
        turns = _answers(question, truth)
        for style in decode.STYLES:
            for kind, result in _variants(turns, style).items():
                entry = multi_turn.Entry(question, truth, result)
                expected = reference.verdict(entry, style)
                judged = multi_turn.judge(entry, style, f"t{uuid.uuid4().hex[:8]}")
                got = (bool(judged.valid), judged.error and judged.error.split(" (")[0])
                seen.setdefault((style, kind), set()).add(expected[0])
                if got != expected:
                    disagreed.append((question["id"], style, kind, expected, got))
    assert not disagreed, disagreed[:10]
    assert len(seen) >= 20, sorted(seen)
    # The ground truth is valid, and each kind meant to break an answer breaks some.
    assert seen[("fc", "truth")] == seen[("prompt", "truth")] == {True}
    assert all(False in seen[k] for k in seen if k[1] in {"drop_call", "turn_missing"})


def _hostile(canary: Path) -> list[list[Any]]:
    payload = f"open({str(canary)!r}, 'w').write('pwned')"
    return [
        [
            f"[exec({payload!r})]",
            f"[cd(folder=__import__('os').system('touch {canary}') + 1)]",
            "[\uff45\uff58\uff49\uff54()]",  # fullwidth exit: BFCL's ban list misses it
            f"[cd(folder={{'open': {{'file': {str(canary)!r}, 'mode': 'w'}}}})]",
            f"[eval(source={payload!r})]",
        ],
        [
            [{"open": {"file": str(canary), "mode": "w"}}],
            [{f"exec({payload!r})#": "{}"}],
            [{"\uff45\uff58\uff49\uff54": "{}"}],
        ],
    ]


@pytest.mark.parametrize("style", decode.STYLES)
def test_a_hostile_results_file_runs_nothing(wheel: Path, tmp_path: Path, style: str) -> None:
    """Calls BFCL's checker would evaluate (exec, open, a fullwidth exit, a nested call)
    reach neither its eval nor the process: the canary file keeps its text, the process
    lives, the entry is invalid, and each refused call is named."""
    canary = tmp_path / "canary.txt"
    canary.write_text("untouched")
    # The stand-in for a refused call is answered by BFCL's deny list, before its eval, also
    # among an entry's bound methods (``backend.use`` checks it with none).
    answered, _ = backend.utils().execute_multi_turn_func_call(
        func_call_list=[decode.REFUSED, "ls()"],
        initial_config={},
        involved_classes=["GorillaFileSystem"],
        model_name="refusal_check",
        test_entry_id="probe",
    )
    multi_turn._forget("refusal_check")
    assert answered[0] == decode.REFUSED_RESPONSE and "Error" not in answered[1], answered
    question = json.loads((FIXTURES / "BFCL_v4_multi_turn_base.json").open().readline())
    answers = FIXTURES / "possible_answer" / "BFCL_v4_multi_turn_base.json"
    truth = json.loads(answers.open().readline())["ground_truth"]
    result = _hostile(canary) + [[PROSE]] * (len(truth) - 2)
    judged = multi_turn.judge(multi_turn.Entry(question, truth, result), style, "hostile")
    assert canary.read_text() == "untouched"
    assert judged.valid is False
    refused = " ".join(judged.refused)
    names = ("'exec'", "'exit'", "'eval'") if style == "prompt" else ("'open'", "'exit'")
    assert all(n in refused for n in names), judged.refused


def test_a_file_that_mixes_styles_is_refused_unless_one_is_named(
    wheel: Path, tmp_path: Path
) -> None:
    question = json.loads((FIXTURES / "BFCL_v4_multi_turn_base.json").open().readline())
    mixed = tmp_path / "mixed.json"
    result = [[[{"cd": '{"folder": "document"}'}], "[ls()]"]]
    mixed.write_text(json.dumps({"id": question["id"], "result": result}) + "\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    environ["CALLGATE_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/nowhere"
    questions = FIXTURES / "BFCL_v4_multi_turn_base.json"
    command = [sys.executable, "-m", "callgate", "eval", "bfcl-multi-turn", str(questions)]
    command += [str(mixed), "--bfcl", str(wheel), "--out", str(tmp_path / "out")]
    ran = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    assert ran.stderr.startswith("callgate: invalid_input: the results mix 1 function-calling")
    assert "--model-style" in ran.stderr
    entries, _ = multi_turn.read_entries(questions, mixed, None, None)
    style, warning = multi_turn.model_style(entries, "fc")
    assert style == "fc" and warning is not None and "1 text steps" in warning
