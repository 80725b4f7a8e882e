"""docs/first-tool.md, followed as a new user follows it: a fresh virtual environment holding
only this checkout installed with the user's install line (no extra: no dev tools, no SDKs),
the page's blocks run in order in an empty directory, against a database of this test's own
and the test Redis. Blocks marked ``background`` are started as background processes (the
worker and the relayer); blocks marked ``not run`` are the steps the test does itself
(installing, pointing at the services). Then the submit's printed result is checked, and the
downstream's rows counted.

Slow (the virtual environment: about a minute); CI's slow tier runs it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.docs.snippets import ROOT, blocks

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.timeout(600)]

PAGE = ROOT / "docs" / "first-tool.md"


def test_the_first_tool_page_works_from_a_fresh_install(
    tmp_path: Path, make_own_database: Callable[[], str], redis_url: str
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(ROOT)],
        check=True,
        timeout=480,
        capture_output=True,
    )
    home = tmp_path / "project"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CALLGATE_", "PYTHON"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        CALLGATE_DATABASE_URL=make_own_database(),
        CALLGATE_REDIS_URL=redis_url,
        CALLGATE_QUEUE=f"first-{uuid.uuid4().hex[:10]}",
    )
    page = blocks(PAGE)
    assert [b.lang for b in page if b.lang == "python"] == ["python"], "one module on the page"
    background: list[subprocess.Popen[bytes]] = []
    script: list[str] = []  # shell blocks run as one script, so their exports carry on
    outputs: list[str] = []
    try:
        for block in page:
            if "not run" in block.marks or block.lang == "text":
                continue
            if block.lang == "python":
                module = re.match(r'"""(\w+\.py)', block.code)
                assert module, "the module block starts by naming its file"
                (home / module[1]).write_text(block.code)
            elif "background" in block.marks:
                for line in block.code.splitlines():
                    command = line.strip().removesuffix("&").strip()
                    if command:
                        background.append(
                            subprocess.Popen(
                                ["bash", "-c", "\n".join([*script, command])],
                                cwd=home,
                                env=env,
                                stdout=subprocess.DEVNULL,
                                stderr=(tmp_path / f"bg{len(background)}.log").open("wb"),
                            )
                        )
            else:
                done = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", "\n".join([*script, block.code])],
                    cwd=home,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert done.returncode == 0, f"{block.id}\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
                # Later blocks see this one's exports (a user's shell keeps them).
                script.extend(
                    line for line in block.code.splitlines() if line.startswith("export ")
                )
    finally:
        for proc in background:
            proc.terminate()
        for proc in background:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert len(background) == 2, "the worker and the relayer"
    last = outputs[-1]
    assert re.search(r"^turn [0-9a-f-]{36}: complete$", last, re.M), last
    rows = {line.split()[0]: line.split()[2] for line in last.splitlines()[2:] if line.strip()}
    assert rows == {"c1": "succeeded", "c2": "succeeded"}, last
    with sqlite3.connect(home / "refunds.db") as ledger:
        assert ledger.execute("SELECT count(*), sum(amount) FROM refunds").fetchone() == (1, 1500)
