"""run_python's real sandbox at registration and at run time: the checks registration makes
(no CALLGATE_ variable inside, packages installed, an interpreter the sandbox's user can
read), the approval gate before a run, limits met by real code, the per-worker cap, and no
sandbox left behind by a killed worker. These need Debian's bubblewrap (bwrap) and
util-linux's prlimit on PATH; the pure parts are in tests/unit/test_sandbox.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from callgate.core.errors import ConfigurationError
from callgate.core.types import FailedTerminal, Succeeded
from callgate.testing import AwaitingApproval, LocalRunner
from callgate.tools.registry import ExecutionContext, Principal, Registry
from callgate.worker.sandbox import Limits, python_tool
from callgate.worker.sandbox.tool import SANDBOX_UID_BASE, RunPython


def test_no_callgate_variable_goes_in() -> None:
    with pytest.raises(ConfigurationError, match="CALLGATE_"):
        python_tool(env={"CALLGATE_DATABASE_URL": "x"})


def test_a_package_named_must_be_installed() -> None:
    with pytest.raises(ConfigurationError, match="not installed"):
        python_tool(packages=("no-such-package-xyz",))


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as another user only for root")
def test_an_interpreter_the_sandbox_user_cannot_read_is_refused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    exe = private / "python3"
    exe.symlink_to(sys.executable)
    with pytest.raises(ConfigurationError, match="no Python interpreter"):
        python_tool(interpreter=str(private / "bin" / "python3"))


def test_with_require_approval_a_call_waits_for_a_person_then_runs() -> None:
    registry = Registry.of([python_tool(require_approval=True)], {"analyst": ["run_python"]})
    runner = LocalRunner(registry, principal=Principal("t-1", "asker", ("analyst",)))
    parked = runner.call("run_python", {"code": "21 * 2"})
    assert isinstance(parked, AwaitingApproval)
    assert parked.impact["code"] == "21 * 2"
    assert runner.contexts == []  # nothing ran
    done = runner.call("run_python", {"code": "21 * 2"}, approved_by="reviewer")
    assert isinstance(done, Succeeded)
    assert done.data["trust"] == "untrusted_tool_output"
    assert done.data["content"]["value"] == "42"


def test_a_limit_ends_the_call_with_its_code_and_the_start_of_the_output() -> None:
    tool = python_tool(limits=Limits(wall_seconds=5, output_bytes=1024))
    runner = LocalRunner(Registry.of([tool], {"analyst": ["run_python"]}))
    code = "print('started')\nwhile True:\n    print('y' * 100)"
    failed = runner.call("run_python", {"code": code}, principal=Principal("t", "u", ("analyst",)))
    assert isinstance(failed, FailedTerminal)
    assert failed.error.code == "sandbox_output_limit"
    stdout = [d for d in failed.error.details if d.code == "sandbox_stdout"]
    assert stdout and stdout[0].message is not None
    assert stdout[0].message.startswith("started\nyyy")


def test_the_per_worker_cap_runs_sandboxes_one_at_a_time() -> None:
    def elapsed(cap: int) -> float:
        tool = python_tool(limits=Limits(wall_seconds=10), max_concurrent=cap)
        ctx = ExecutionContext("t", "u", "op", "key", 1, "req")
        args = RunPython(code="import time; time.sleep(0.6)")
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(lambda _: tool.handler(args, ctx), range(2)))
        assert [r["exit_code"] for r in done] == [0, 0]
        return time.monotonic() - started

    assert elapsed(1) >= 1.2  # the second waited for the first's slot
    assert elapsed(2) < 1.2


def _sandboxed_pids(program: str | None = None) -> list[int]:
    """Processes running as a sandbox slot's uid (a root worker's sandboxes), or only those
    whose program name starts with ``program``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid_line = next(
                    line
                    for line in (entry / "status").read_text().splitlines()
                    if line.startswith("Uid:")
                )
                comm = (entry / "comm").read_text().strip()
            except (OSError, StopIteration):
                continue
            if int(uid_line.split()[1]) >= SANDBOX_UID_BASE and (
                program is None or comm.startswith(program)
            ):
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker's sandboxes have their own uids")
def test_a_worker_killed_mid_run_leaves_no_sandbox_behind() -> None:
    script = (
        "from callgate.tools.registry import ExecutionContext\n"
        "from callgate.worker.sandbox import Limits, python_tool\n"
        "from callgate.worker.sandbox.tool import RunPython\n"
        "tool = python_tool(limits=Limits(wall_seconds=60))\n"
        "print('ready', flush=True)\n"
        "tool.handler(RunPython(code='import time; time.sleep(60)'), "
        "ExecutionContext('t', 'u', 'op', 'k', 1, 'r'))\n"
    )
    before = set(_sandboxed_pids())  # another test's sandbox still ending is not this one's
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        # Mid-run: the snippet's interpreter runs inside the sandbox (prlimit and bwrap have
        # started it), not the sandbox still being set up.
        deadline = time.monotonic() + 10
        while not set(_sandboxed_pids("python")) - before and time.monotonic() < deadline:
            time.sleep(0.02)
        mine = set(_sandboxed_pids()) - before
        assert set(_sandboxed_pids("python")) - before, "the sandbox never started"
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 10
    while mine & set(_sandboxed_pids()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mine & set(_sandboxed_pids()) == set()
