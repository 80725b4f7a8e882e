"""Finding one's tools: ``CALLGATE_TOOLS=mytools:registry`` with ``mytools.py`` in the current
directory, or in a directory ``callgate --path`` names.

The CLI runs as its console script does: ``python -P`` leaves the current directory off
sys.path (``python -m`` would put it there, hiding the bug this guards against).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.snippets import checkout_pythonpath

pytestmark = pytest.mark.services

MODULE = '''
from callgate import Registry, tool


@tool
def shout(text: str) -> dict[str, str]:
    """Upper-case a text."""
    return {"text": text.upper()}


registry = Registry.of([shout], {"support": ["shout"]})
'''


def run(cwd: Path, *args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_TOOLS": "mytools:registry",
        "PYTHONPATH": checkout_pythonpath(os.environ.get("PYTHONPATH")),
    }
    return subprocess.run(
        [sys.executable, "-P", "-m", "callgate.ops.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def tools_dir(tmp_path: Path) -> Path:
    home = tmp_path / "project"
    home.mkdir()
    (home / "mytools.py").write_text(MODULE)
    return home


def names(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [d["name"] for d in json.loads(result.stdout)]


def test_the_current_directory_is_searched(tools_dir: Path, database_url: str) -> None:
    assert names(run(tools_dir, "tools", "--role", "support", database_url=database_url)) == [
        "shout"
    ]


def test_path_names_another_directory(tools_dir: Path, tmp_path: Path, database_url: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run(
        elsewhere, "--path", str(tools_dir), "tools", "--role", "support", database_url=database_url
    )
    assert names(result) == ["shout"]


def test_a_missing_module_is_one_line_naming_module_path_and_fix(
    tmp_path: Path, database_url: str
) -> None:
    result = run(tmp_path, "tools", "--role", "support", database_url=database_url)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    line = lines[0]
    assert line.startswith("callgate: invalid_configuration: ")
    assert "'mytools'" in line
    assert str(tmp_path.resolve()) in line  # the directory searched
    assert "--path" in line  # how to fix it


def test_a_dependency_the_module_lacks_is_named_as_such(tools_dir: Path, database_url: str) -> None:
    (tools_dir / "mytools.py").write_text("import not_installed_anywhere\n" + MODULE)
    result = run(tools_dir, "tools", "--role", "support", database_url=database_url)
    assert result.returncode == 2
    assert "not_installed_anywhere" in result.stderr
    assert "--path" not in result.stderr  # not a search-path problem


def test_processes_started_by_callgate_inherit_the_path(tmp_path: Path) -> None:
    """``up`` starts workers with this process's environment: PYTHONPATH carries --path."""
    probe = (
        "import os, sys; from callgate.ops.cli.main import use_paths; "
        f"use_paths([{str(tmp_path)!r}]); "
        "print(os.environ['PYTHONPATH'].split(os.pathsep)[0]); print(sys.path[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(tmp_path), str(tmp_path)]
