"""``callgate eval bfcl-multi-turn``'s pure parts: a BFCL result file decoded as BFCL's
evaluation decodes it, call strings turned back into proposals, BFCL function docs turned
into tools (reads and writes), the tables; and its input errors, one line each (the CLI runs
as a process with the service URLs on closed ports: nothing here starts a service)."""

from __future__ import annotations

import inspect
import json
import os
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


def test_function_calling_steps_decode_as_bfcls_convert_to_function_call() -> None:
    step = [{"cd": '{"folder": "document"}'}, {"mkdir": {"dir_name": "temp"}}]
    assert decode.decode_step(step) == ["cd(folder='document')", "mkdir(dir_name='temp')"]
    assert decode.decode_step({"ls": "{}"}) == ["ls()"]


def test_prompted_steps_keep_each_call_as_written() -> None:
    text = "```python\n[sort('final_report.pdf'), ls(a=True)]\n```"
    assert decode.decode_step(text) == ["sort('final_report.pdf')", "ls(a=True)"]
    assert decode.decode_step("cd(folder='..')") == ["cd(folder='..')"]


@pytest.mark.parametrize(
    "step",
    [
        "[ls(a=__import__('os').system('touch /tmp/pwned'))]",
        "[cd(folder='a' + 'b')]",
        "[cd(**{'folder': 'a'})]",
        "[cd(folder=open('/etc/passwd').read())]",
        [{"__import__('os').system('x') or ls": "{}"}],
        [{"cd": {"folder); import os; os.system('x'); (": 1}}],
    ],
)
def test_a_step_that_is_not_literal_calls_never_reaches_bfcls_eval(step: object) -> None:
    """BFCL's checker runs the call strings with eval(): only identifiers and literals may
    get there."""
    with pytest.raises(decode.NotCalls):
        decode.decode_step(step)


def test_prompted_literal_calls_are_written_back_from_their_literals() -> None:
    text = "[mv(source = 'a.txt',destination='b'), f( [1, (2, 3)] , x={'k': None})]"
    assert decode.decode_step(text) == [
        "mv(source='a.txt', destination='b')",
        "f([1, (2, 3)], x={'k': None})",
    ]


def test_prose_and_empty_steps_are_skipped_as_bfcl_skips_them() -> None:
    result = [["[cd(folder='a')]", "Done, the folder is open."], [[], "I cannot do that."]]
    assert decode.decode_result(result) == [[["cd(folder='a')"]], []]


@pytest.mark.parametrize("result", ["[ls()]", [["ok"], "turn"], None, {"turns": []}])
def test_a_result_that_is_not_turns_of_steps_is_refused(result: object) -> None:
    with pytest.raises(ValueError):
        decode.decode_result(result)


def _sort(file_name: str, reverse: bool = False) -> None: ...


def test_positional_arguments_are_named_by_the_methods_signature() -> None:
    signatures = {"sort": inspect.signature(_sort)}
    call = decode.parse_call("sort('final_report.pdf', reverse=True)", signatures.get)
    assert call == decode.Call("sort", {"file_name": "final_report.pdf", "reverse": True})
    tupled = decode.parse_call("lockDoors(door=('driver', 'rear'))", signatures.get)
    assert tupled.arguments == {"door": ["driver", "rear"]}


@pytest.mark.parametrize(
    "text",
    [
        "sort(name_of_file)",  # a name, not a literal
        "mystery('x')",  # positional, and no signature to name it
        "sort('a', 'b', 'c')",  # more than the signature takes
        "os.system('ls')",  # not a function by name
        "ls(**{'a': True})",
        "[ls()",
    ],
)
def test_calls_that_cannot_be_proposed_are_refused(text: str) -> None:
    signatures = {"sort": inspect.signature(_sort)}
    with pytest.raises(ValueError):
        decode.parse_call(text, signatures.get)


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
    assert len(decode.decode_result(first.result)) == len(first.ground_truth)
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
