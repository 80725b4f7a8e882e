"""The package as users install it: built into a wheel, installed into a fresh environment.

Inside the repository the code is importable from the checkout; these tests make sure what a
user gets from ``pip install`` is the one ``callgate`` namespace (no generic top-level
``producer``/``worker``/``store``/``ops`` packages), ships ``py.typed``, and runs the demo.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Both artefacts, the wheel built from the sdist: what `python -m build` publishes.
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("callgate-*.whl")
    return built


def test_wheel_holds_one_callgate_namespace_and_its_type_marker(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"callgate"}
    assert "callgate/py.typed" in names
    for module in ("producer", "worker", "store", "ops"):
        assert f"callgate/{module}/__init__.py" in names
    # Migrations are data the installed package needs at run time.
    assert any(n.startswith("callgate/store/migrations/versions/") for n in names)


@pytest.mark.timeout(600)
def test_installed_wheel_imports_the_public_api_and_runs_the_demo(
    wheel: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=480,
    )
    # Run from an empty directory so nothing resolves to the checkout.
    work = tmp_path / "app"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLGATE_", "PYTHON"))}
    probe = (
        "import importlib.util, callgate\n"
        "missing = [n for n in callgate.__all__ if getattr(callgate, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert callgate.Producer.__module__ == 'callgate.producer.producer'\n"
        "generic = [m for m in ('producer', 'worker', 'store', 'ops')"
        " if importlib.util.find_spec(m) is not None]\n"
        "assert not generic, generic\n"
        "print(callgate.__file__)\n"
    )
    shown = subprocess.run(
        [str(python), "-c", probe], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert str(env_dir) in shown.stdout

    demo = subprocess.run(
        [str(env_dir / "bin" / "callgate"), "demo", "--data-dir", str(tmp_path / "data")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "[FAIL]" not in demo.stdout
    (passed, total) = map(int, re.search(r"(\d+)/(\d+) invariants hold", demo.stdout).groups())
    assert passed == total >= 13
