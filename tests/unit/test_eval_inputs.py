"""Every ``callgate eval`` input error is one line with its code, never a traceback: deep
nesting (YAML, aliases, JSON), files past the size cap (checked before reading), an ``--out``
that cannot be written. The CLI runs as a process; the service URLs point at closed ports,
so nothing here starts a service.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from callgate.ops.lab.eval.fixture import BUILTIN

FIXTURE = BUILTIN / "fixtures" / "internal-metric-missing.yaml"
BFCL = Path(__file__).parents[1] / "fixtures" / "bfcl" / "import"
DEEP = 3000
CLI = [sys.executable, "-m", "callgate", "eval"]
NOWHERE = {
    "CALLGATE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere",
    "CALLGATE_REDIS_URL": "redis://127.0.0.1:1/0",
}


def eval_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    environ.update(NOWHERE)
    environ.update(env or {})
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(run: subprocess.CompletedProcess[str], code: str = "invalid_input") -> str:
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr[-3000:]
    assert lines[0].startswith(f"callgate: {code}: "), run.stderr
    return lines[0]


def suite_with(folder: Path, fixture_text: str) -> Path:
    (folder / "fixtures").mkdir(parents=True)
    (folder / "suite.yaml").write_text(
        "name: probe\ntools: callgate.ops.lab.eval.stubs:registry\n"
        "doubles: callgate.ops.lab.eval.stubs\n"
    )
    (folder / "fixtures" / "probe.yaml").write_text(fixture_text)
    return folder


# Nesting ---------------------------------------------------------------------------------


def valid_with(setup: str) -> str:
    """The built-in irrelevance fixture with ``setup`` (a YAML block of its own) added: a
    fixture that is otherwise valid, so only the nesting can refuse it."""
    return FIXTURE.read_text() + "setup:\n" + setup


def yaml_flow(depth: int) -> str:
    return valid_with("  x: " + "[" * depth + "]" * depth + "\n")


def yaml_block(depth: int) -> str:
    return valid_with("".join("  " * (i + 1) + "-\n" for i in range(depth)))


def yaml_aliases(depth: int) -> str:
    """Shallow text, deep value: each anchor holds the one before it."""
    chain = "".join(f"  a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, depth))
    return valid_with("  a0: &a0 []\n" + chain)


def yaml_laughs() -> str:
    """Nine levels of nine aliases each: 387 million values from 1 kB of text."""
    rows = ["  l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        rows.append(f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return valid_with("\n".join(rows) + "\n")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (yaml_flow(DEEP), "nesting deeper than"),
        (yaml_block(DEEP), "nesting deeper than"),
        (yaml_aliases(DEEP), "nesting deeper than"),
        (yaml_laughs(), "aliases"),
    ],
    ids=["flow", "block", "aliases", "laughs"],
)
def test_a_fixture_nested_too_deep_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    folder = suite_with(tmp_path / "suite", text)
    line = one_line_error(eval_cli("run", str(folder), "--out", str(tmp_path / "out")))
    assert "probe.yaml" in line and said in line


def test_a_fixture_nested_within_the_cap_is_read(tmp_path: Path) -> None:
    """50 levels pass the depth check: the run goes on to the (unreachable) services."""
    folder = suite_with(tmp_path / "suite", yaml_flow(50))
    run = eval_cli("run", str(folder), "--out", str(tmp_path / "out"))
    assert "unavailable" in one_line_error(run, "redis_unavailable")


def test_a_response_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    responses = tmp_path / "deep-model"
    responses.mkdir()
    deep = responses / "internal-metric-missing.1.openai-chat.json"
    deep.write_text('{"choices": ' + "[" * DEEP + "]" * DEEP + "}")
    run = eval_cli("run", "builtin", "--responses", str(responses), "--out", str(tmp_path / "o"))
    assert str(deep) in one_line_error(run)


def test_a_compared_report_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"metrics": ' + "[" * DEEP + "]" * DEEP + "}")
    assert str(deep) in one_line_error(eval_cli("compare", str(deep), str(deep)))


@pytest.mark.parametrize("where", ["questions", "result-arguments", "result-python"])
def test_bfcl_input_nested_too_deep_is_one_line(tmp_path: Path, where: str) -> None:
    questions = tmp_path / "BFCL_v4_irrelevance.json"
    first = (BFCL / "BFCL_v4_irrelevance.json").read_text().splitlines()[0]
    if where == "questions":
        questions.write_text(first[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}\n")
        args: list[str] = []
    else:
        questions.write_text(first + "\n")
        result = tmp_path / "result.json"
        ident = json.loads(first)["id"]
        if where == "result-arguments":
            value: object = [{"calculate_triangle_area": "[" * DEEP + "]" * DEEP}]
        else:
            value = "[calculate_triangle_area(base=" + "-" * 100_000 + "1)]"
        result.write_text(json.dumps({"id": ident, "result": value}) + "\n")
        args = ["--results", str(result)]
    run = eval_cli("import-bfcl", str(questions), *args, "--out", str(tmp_path / "suite"))
    if where == "result-python":
        # Too deep for Python's parser: the model's prose, as any other unparsable string.
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Traceback" not in run.stderr
    else:
        one_line_error(run)
        assert not (tmp_path / "suite").exists()


# Size ------------------------------------------------------------------------------------


def test_a_fixture_past_the_size_cap_is_refused_naming_the_setting(tmp_path: Path) -> None:
    folder = suite_with(tmp_path / "suite", FIXTURE.read_text())
    size = (folder / "fixtures" / "probe.yaml").stat().st_size
    run = eval_cli(
        "run",
        str(folder),
        "--out",
        str(tmp_path / "out"),
        env={"CALLGATE_EVAL_MAX_FILE_BYTES": str(size - 1)},
    )
    line = one_line_error(run)
    assert "probe.yaml" in line and "CALLGATE_EVAL_MAX_FILE_BYTES" in line


def test_the_option_sets_the_cap_for_bfcl_files(tmp_path: Path) -> None:
    questions = BFCL / "BFCL_v4_irrelevance.json"
    run = eval_cli(
        "import-bfcl", str(questions), "--max-file-bytes", "100", "--out", str(tmp_path / "s")
    )
    assert str(questions) in one_line_error(run)
    assert not (tmp_path / "s").exists()


def test_a_file_past_the_default_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A sparse 128 MiB file (no disk used): refused from its size, so the process never
    holds it; its peak memory, measured by a parent of its own, stays under the file's
    size."""
    huge = tmp_path / "BFCL_v4_irrelevance.json"
    with huge.open("wb") as f:
        f.truncate(128 * 1024 * 1024)
    probe = (
        "import resource, subprocess, sys\n"
        "run = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stderr.write(run.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(run.returncode)\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    run = subprocess.run(
        [sys.executable, "-c", probe, *CLI, "import-bfcl", str(huge), "--out", str(tmp_path / "s")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_line_error(run)
    assert "CALLGATE_EVAL_MAX_FILE_BYTES" in line
    peak_kib = int(run.stdout.strip())
    assert peak_kib < 128 * 1024, f"peak RSS {peak_kib} KiB"


# --out -----------------------------------------------------------------------------------


def test_run_out_a_dangling_symlink_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "gone" / "away")
    assert "--out" in one_line_error(eval_cli("run", "builtin", "--out", str(out)))


def test_run_out_under_proc_is_one_line() -> None:
    run = eval_cli("run", "builtin", "--out", "/proc/callgate-eval-report")
    assert "--out" in one_line_error(run)


@pytest.mark.parametrize("kind", ["dangling", "proc"])
def test_import_out_that_cannot_be_written_is_one_line(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "suite"
    if kind == "dangling":
        out.symlink_to(tmp_path / "gone")
    else:
        out = Path("/proc/callgate-bfcl-suite")
    run = eval_cli("import-bfcl", str(BFCL / "BFCL_v4_irrelevance.json"), "--out", str(out))
    assert "--out" in one_line_error(run)
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize(
    "doc",
    [{"metrics": {"x": 5}}, {"metrics": {"x": {"value": "high"}}}, {"metrics": []}],
    ids=["metric-not-an-object", "value-not-a-number", "metrics-not-an-object"],
)
def test_compare_refuses_a_report_of_another_shape_in_one_line(
    tmp_path: Path, doc: dict[str, object]
) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps(doc))
    assert "not a callgate eval report" in one_line_error(
        eval_cli("compare", str(report), str(report))
    )


def test_json_depth_counts_brackets_outside_strings_only() -> None:
    from callgate.ops.lab.eval.inputs import json_depth

    assert json_depth("{}") == 1
    assert json_depth('{"a": [[1], [2, [3]]]}') == 4
    assert json_depth('["[[[[", "\\"[[[", {"k]]": "{"}]') == 2
    assert json_depth("3") == 0
