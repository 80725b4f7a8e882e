"""A suite names only modules of its own folder (or callgate's stubs): ``callgate eval run``
resolves each module's file before importing anything, and a module elsewhere never runs.

The CLI runs as a process in a folder where the outside module is importable; the module
would write a marker file when imported, and the test looks for that file. The service URLs
point at closed ports, so a run that got past the check ends at once instead of starting
embedded services.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from callgate.core.errors import InputError
from callgate.ops.lab.eval.fixture import BUILTIN

FIXTURE = BUILTIN / "fixtures" / "internal-metric-missing.yaml"
NOWHERE = {
    "CALLGATE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere",
    "CALLGATE_REDIS_URL": "redis://127.0.0.1:1/0",
}


def eval_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env.update(NOWHERE)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run(
        [sys.executable, "-m", "callgate", "eval", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(run: subprocess.CompletedProcess[str], code: str) -> str:
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"callgate: {code}: "), run.stderr
    return lines[0]


def marker_module(folder: Path, marker: Path, name: str = "evil.py") -> Path:
    """A module that leaves ``marker`` behind when imported (and has install/seed/registry,
    so an import that succeeds would not be refused for lacking them)."""
    folder.mkdir(parents=True, exist_ok=True)
    module = folder / name
    module.write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('ran')\n"
        "def install(engine): pass\n"
        "def seed(engine, setup): pass\n"
        "def registry(): raise SystemExit('registry')\n"
    )
    return module


def suite(folder: Path, **names: str) -> Path:
    (folder / "fixtures").mkdir(parents=True, exist_ok=True)
    (folder / "fixtures" / FIXTURE.name).write_bytes(FIXTURE.read_bytes())
    lines = ["name: probe"] + [f"{k}: {v}" for k, v in names.items()]
    (folder / "suite.yaml").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize(
    "names",
    [
        {"tools": "callgate.ops.lab.eval.stubs:registry", "doubles": "evilsuite.evil"},
        {"tools": "evilsuite.evil:registry"},
        {"tools": "evilsuite.evil:registry", "doubles": "callgate.ops.lab.eval.stubs"},
    ],
    ids=["doubles", "tools-and-its-doubles", "tools"],
)
def test_a_module_outside_the_suite_folder_is_refused_and_never_runs(
    tmp_path: Path, names: dict[str, str]
) -> None:
    marker = tmp_path / "RAN"
    marker_module(tmp_path / "evilsuite", marker)
    (tmp_path / "evilsuite" / "__init__.py").write_text("")
    suite(tmp_path / "suite", **names)
    run = eval_cli(tmp_path, "run", "suite", "--out", str(tmp_path / "out"))
    line = one_line_error(run, "invalid_input")
    assert "evilsuite.evil" in line and "outside" in line
    assert not marker.exists()


def test_a_symlink_in_the_suite_folder_to_a_module_elsewhere_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "RAN"
    elsewhere = marker_module(tmp_path / "elsewhere", marker)
    folder = suite(tmp_path / "mine", tools="mine.doubles:registry", doubles="mine.doubles")
    (folder / "doubles.py").symlink_to(elsewhere)
    run = eval_cli(tmp_path, "run", "mine", "--out", str(tmp_path / "out"))
    line = one_line_error(run, "invalid_input")
    assert "mine.doubles" in line
    assert not marker.exists()


def test_a_package_init_outside_the_suite_folder_is_refused(tmp_path: Path) -> None:
    """``pkg.mine.doubles`` lies in the suite folder ``pkg/mine``, but importing it would run
    ``pkg/__init__.py``, which does not."""
    marker = tmp_path / "RAN"
    marker_module(tmp_path / "pkg", marker, name="__init__.py")
    folder = suite(
        tmp_path / "pkg" / "mine", tools="pkg.mine.doubles:registry", doubles="pkg.mine.doubles"
    )
    (folder / "doubles.py").write_text("def install(engine): pass\ndef seed(engine, s): pass\n")
    run = eval_cli(tmp_path, "run", "pkg/mine", "--out", str(tmp_path / "out"))
    line = one_line_error(run, "invalid_input")
    assert "pkg/__init__.py" in line or "pkg" in line
    assert not marker.exists()


def test_a_module_of_the_suites_own_folder_is_imported(tmp_path: Path) -> None:
    """The allowed case really imports it: the marker appears, and the run goes on to the
    scratch database (here unreachable)."""
    marker = tmp_path / "RAN"
    folder = suite(tmp_path / "mine", tools="mine.doubles:registry", doubles="mine.doubles")
    marker_module(folder, marker, name="doubles.py")
    (folder / "__init__.py").write_text("")
    run = eval_cli(tmp_path, "run", "mine", "--out", str(tmp_path / "out"))
    assert marker.exists()
    assert "invalid_input" not in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_the_builtin_suite_and_the_stubs_resolve_without_being_imported(tmp_path: Path) -> None:
    from callgate.ops.lab.eval import suite_modules

    for module in ("callgate.ops.lab.eval.stubs", "callgate.ops.lab.eval.suites.builtin.tools"):
        sys.modules.pop(module, None)
        file = suite_modules.resolve(BUILTIN, module, "tools")
        assert file.is_file()
        assert module not in sys.modules
    with pytest.raises(InputError, match="outside"):
        suite_modules.resolve(tmp_path, "callgate.ops.lab.eval.suites.builtin.tools", "tools")
    with pytest.raises(InputError, match="no module"):
        suite_modules.resolve(tmp_path, "no_such_module_anywhere", "doubles")


def test_the_help_says_a_suite_is_code_that_runs() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "callgate", "eval", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    said = " ".join(run.stdout.split())
    assert "runs its code" in said and "your privileges" in said
