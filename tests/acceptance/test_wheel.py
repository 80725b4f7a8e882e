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
        assert f"ops/http/static/{static}" in names


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
