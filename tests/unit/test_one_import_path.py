"""callgate's modules have one import path. The checkout's top-level producer/, worker/, store/
and ops/ are links into callgate/ for readers; imported through a link (Python puts the
working directory on sys.path), a module would load twice under two names, and an `except`
for one copy of an exception class would miss the other copy."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINKS = ("producer", "worker", "store", "ops")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("name", LINKS)
def test_importing_through_the_link_is_refused_with_the_path_to_use(name: str) -> None:
    assert (ROOT / name).is_symlink()
    refused = _python(f"import {name}")
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: import callgate.{name}, not {name}:"), refused.stderr


def test_the_package_imports_under_its_own_name_from_the_same_directory() -> None:
    done = _python("import " + ", ".join(f"callgate.{name}" for name in LINKS) + "; print('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


def test_the_linter_refuses_the_second_path_too() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lint = config["tool"]["ruff"]["lint"]
    assert "TID251" in lint["select"]
    assert set(lint["flake8-tidy-imports"]["banned-api"]) == set(LINKS)
    # ruff itself, with the project's configuration, on code that imports through each link.
    probe = "".join(f"import {name}\n" for name in LINKS) + "import callgate.store\n"
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--select",
            "TID251",
            "--stdin-filename",
            "probe.py",
            "-",
        ],
        cwd=ROOT,
        input=probe,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    for name in LINKS:
        assert f"`{name}` is banned" in checked.stdout, checked.stdout
    assert "`callgate.store` is banned" not in checked.stdout
