"""``callgate eval bfcl-multi-turn``'s pure parts: a BFCL result file decoded as BFCL's
evaluation decodes it, call strings turned back into proposals, BFCL function docs turned
into tools (reads and writes), the tables; and its input errors, one line each (the CLI runs
as a process with the service URLs on closed ports: nothing here starts a service)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from callgate.core.errors import InputError
from callgate.ops.lab.eval import bfcl_multi_turn as multi_turn
from callgate.ops.lab.eval import bfcl_multi_turn_decode as decode
from callgate.ops.lab.eval import bfcl_multi_turn_report as report
from callgate.ops.lab.eval import bfcl_multi_turn_tools as tools
from callgate.tools.registry import READ_ONLY, SideEffect

FILES = Path(__file__).parents[1] / "fixtures" / "bfcl" / "multi_turn"
QUESTIONS = FILES / "BFCL_v4_multi_turn_base.json"
CLI = [sys.executable, "-m", "callgate", "eval"]
NOWHERE = {
    "CALLGATE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere",
    "CALLGATE_REDIS_URL": "redis://127.0.0.1:1/0",
}


METHODS = frozenset({"cd", "ls", "mkdir", "sort", "mv", "lockDoors"})


def _fc(step: object) -> list[str]:
    """A stand-in for BFCL's ``convert_to_function_call`` (the real one is checked against in
    tests/integration/test_bfcl_multi_turn_conformance.py)."""
    assert isinstance(step, list)
    return [f"{k}()" for item in step for k in item]


DECODERS = decode.Decoders(fc=_fc, prompt=_fc, is_empty=lambda calls: not calls)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("exec('import os')", "'exec' is not a method"),
        ("open(file='/etc/passwd', mode='w')", "'open' is not a method"),
        ("\uff45\uff58\uff49\uff54()", "'exit' is not a method"),  # fullwidth, NFKC: exit
        ("__import__('os').system('id')", "not a call of a function by name"),
        ("ls(a=__import__('os').system('touch /tmp/pwned'))", "a is not a literal"),
        ("cd(folder=os.system(command='id'))", "folder is not a literal"),
        ("cd(**{'folder': 'a'})", "**arguments"),
        ("cd(*['a'])", "positional argument is not a literal"),
        ("cd(folder='a' + 'b')", "folder is not a literal"),
        ("cd(folder=1e999)", "does not survive being written back"),  # inf: a name when shown
        ("ls(), exec('x')", "not a call of a function by name"),
        ("cd(folder='a'); exec('x')", "not a Python call"),
        ("[ls()", "not a Python call"),
    ],
)
def test_a_call_that_is_not_a_literal_call_of_a_method_never_reaches_bfcls_eval(
    text: str, reason: str
) -> None:
    """BFCL's executor runs each call string with eval(): only a call of one of the entry's
    methods, by name, with literal arguments, may get there."""
    with pytest.raises(decode.NotCalls, match=re.escape(reason)):
        decode.safe_call(text, METHODS)
    guarded, refused = decode.guard([[["ls()", text]]], METHODS)
    assert guarded == [[["ls()", decode.REFUSED]]]
    assert [(r.turn, r.step, r.index) for r in refused] == [(0, 0, 1)]


def test_a_literal_call_of_a_method_is_written_back_from_its_literals() -> None:
    assert decode.safe_call("mv(source = 'a.txt',destination=\"b\")", METHODS) == (
        "mv(source='a.txt', destination='b')"
    )
    assert decode.safe_call("sort('final_report.pdf')", METHODS) == "sort('final_report.pdf')"
    assert decode.safe_call("ls(a=-5, depth=(1, [None, {'k': b'x'}]))", METHODS) == (
        "ls(a=-5, depth=(1, [None, {'k': b'x'}]))"
    )
    # A fullwidth method name is the method, as Python (and BFCL's eval) reads it.
    assert decode.safe_call("\uff4c\uff53()", METHODS) == "ls()"


def test_the_refused_stand_in_is_itself_no_method() -> None:
    assert decode.parse_call(decode.REFUSED).name not in METHODS


def test_steps_are_decoded_and_skipped_as_bfcls_evaluation_loop_does() -> None:
    def failing(step: object) -> list[str]:
        if step == "prose":
            raise SyntaxError("not calls")
        return [] if step == [] else _fc(step)

    decoders = decode.Decoders(fc=failing, prompt=failing, is_empty=lambda calls: not calls)
    result = [[[{"cd": "{}"}], "prose", []], ["prose"], "ab"]
    assert decode.decode_result(result, failing, decoders) == [[["cd()"]], [], []]


@pytest.mark.parametrize("result", ["[ls()]", None, {"turns": []}, [[{"cd": "{}"}], 7]])
def test_a_result_that_is_not_a_list_of_turns_is_refused(result: object) -> None:
    with pytest.raises(ValueError):
        decode.decode_result(result, _fc, DECODERS)


def test_positional_arguments_are_kept_for_the_ground_truth_and_never_proposed() -> None:
    call = decode.parse_call("sort('final_report.pdf', reverse=True)")
    assert call == decode.Call("sort", {"reverse": True}, ("final_report.pdf",))
    tupled = decode.parse_call("lockDoors(door=('driver', 'rear'))")
    assert decode.plain(tupled.arguments) == {"door": ["driver", "rear"]}
    record, proposal = multi_turn._proposed(0, 0, 0, "sort('a.pdf')", "BFCL's response")
    assert proposal is None and record.outcome == "not_proposed"
    refused, nothing = multi_turn._proposed(0, 0, 1, decode.REFUSED, decode.REFUSED_RESPONSE)
    assert nothing is None and refused.tool is None


def _prompt_like(step: object) -> list[str]:
    if not isinstance(step, str) or not step.startswith("["):
        raise SyntaxError("not a list of calls")
    return [step.strip("[]")]


def test_a_file_in_one_style_is_decoded_in_it_and_a_mixed_one_is_told_apart() -> None:
    decoders = decode.Decoders(fc=_fc, prompt=_prompt_like, is_empty=lambda calls: not calls)
    fc = [[[{"cd": "{}"}], "Done."]]
    prompt = [["[cd()]", "Done."]]
    assert decode.shapes([fc, fc], decoders) == decode.Shapes(fc=2, prompt=0)
    assert decode.shapes([fc], decoders).style() == "fc"
    assert decode.shapes([prompt], decoders).style() == "prompt"
    mixed = decode.shapes([fc, prompt], decoders)
    assert mixed.mixed and mixed == decode.Shapes(fc=1, prompt=1)


LS = {
    "name": "ls",
    "description": "List the directory.",
    "parameters": {
        "type": "dict",
        "properties": {"a": {"type": "boolean"}, "depth": {"type": "float"}},
        "required": [],
    },
}


def test_a_bfcl_function_doc_becomes_a_tool_with_json_schema() -> None:
    tool = tools.tool_for("GorillaFileSystem", LS)
    assert tool.name == "ls" and tool.kind == "read" and tool.effect == READ_ONLY
    assert tool.parameters() == {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "depth": {"type": "number"}},
        "required": [],
    }


def test_state_changing_and_unknown_functions_are_writes() -> None:
    mkdir = tools.tool_for("GorillaFileSystem", {**LS, "name": "mkdir"})
    assert mkdir.kind == "write" and mkdir.effect == SideEffect()
    assert tools.kind_of("GorillaFileSystem", "something_new") == "write"
    assert tools.kind_of("NoSuchClass", "ls") == "write"
    # It reads, but draws from the instance's random generator: the state changes.
    assert tools.kind_of("VehicleControlAPI", "get_current_speed") == "write"


def test_entries_pair_questions_with_results_and_ground_truth() -> None:
    entries, unanswered = multi_turn.read_entries(
        QUESTIONS, FILES / "result" / "ground-truth.json", None, None
    )
    assert [e.id for e in entries][:2] == ["multi_turn_base_0", "multi_turn_base_14"]
    assert unanswered == [] and len(entries) == 4
    first = entries[0]
    assert first.category == "multi_turn_base" and not first.long_context
    assert first.classes == ["TwitterAPI", "GorillaFileSystem"]
    assert len(first.result) == len(first.ground_truth)
    limited, _ = multi_turn.read_entries(QUESTIONS, FILES / "result" / "mutated.json", None, 2)
    assert len(limited) == 2


def test_a_question_file_of_another_category_is_refused(tmp_path: Path) -> None:
    simple = tmp_path / "BFCL_v4_simple_python.json"
    simple.write_text(json.dumps({"id": "simple_python_0", "question": []}) + "\n")
    with pytest.raises(InputError, match="not a BFCL multi-turn question file"):
        multi_turn.read_entries(simple, simple, simple, None)


def _entry_run(**changes: object) -> multi_turn.EntryRun:
    run = multi_turn.EntryRun("multi_turn_base_0", "multi_turn_base", 1, state_equal=True)
    run.bfcl_valid = True
    run.calls = [
        multi_turn.CallRun(0, 0, "mkdir(dir_name='a')", "mkdir", "succeeded", "None", "None"),
    ]
    run.calls[0].write, run.calls[0].effects, run.calls[0].runs = True, 1, 1
    for key, value in changes.items():
        setattr(run, key, value)
    return run


def test_the_executor_check_needs_state_responses_effects_and_correlation() -> None:
    assert _entry_run().executor_ok
    assert not _entry_run(state_equal=False).executor_ok
    assert not _entry_run(correlated=False).executor_ok
    twice = _entry_run()
    twice.calls[0].effects = 2  # a write stored twice
    assert not twice.executor_ok
    other = _entry_run()
    other.calls[0].response = "Error during execution: no"
    assert not other.executor_ok and other.redacted == 0
    redacted = _entry_run()
    redacted.calls[0].response = '{"access_token": [redacted]}'
    assert redacted.executor_ok and redacted.redacted == 1
    shown = report.tables([_entry_run(), _entry_run(state_equal=False, bfcl_valid=False)])
    assert "BFCL: 1 valid, 1 invalid, accuracy 0.500" in shown
    assert "Executor: 1/2 entries exact" in shown


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    environ.update(NOWHERE)
    return subprocess.run([*CLI, *args], env=environ, capture_output=True, text=True, timeout=120)


def _one_line(run: subprocess.CompletedProcess[str], code: str) -> str:
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"callgate: {code}: "), run.stderr
    return lines[0]


def test_without_bfcl_eval_the_command_says_how_to_install_it(tmp_path: Path) -> None:
    ran = _cli(
        "bfcl-multi-turn",
        str(QUESTIONS),
        str(FILES / "result" / "ground-truth.json"),
        "--bfcl",
        str(tmp_path),
        "--out",
        str(tmp_path / "out"),
    )
    assert "pip install bfcl-eval --no-deps" in _one_line(ran, "invalid_configuration")


def test_input_errors_are_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "results.json"
    broken.write_text("{not json\n")
    ran = _cli("bfcl-multi-turn", str(QUESTIONS), str(broken), "--out", str(tmp_path / "o"))
    assert "not JSON" in _one_line(ran, "invalid_input")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"id": "someone_else", "result": []}) + "\n")
    ran = _cli("bfcl-multi-turn", str(QUESTIONS), str(other), "--out", str(tmp_path / "o"))
    assert "no result for any question" in _one_line(ran, "invalid_input")


def test_import_bfcl_points_a_multi_turn_file_to_the_command(tmp_path: Path) -> None:
    ran = _cli("import-bfcl", str(QUESTIONS), "--out", str(tmp_path / "suite"))
    assert "callgate eval bfcl-multi-turn" in _one_line(ran, "invalid_input")
