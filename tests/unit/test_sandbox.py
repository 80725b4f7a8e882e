"""run_python's pure parts (which limit a run met, the seccomp program, images in safe
results) and its refusal to register where the sandbox cannot be built."""

from __future__ import annotations

import base64
import errno
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.core.types import FailedTerminal, Succeeded
from callgate.testing import AwaitingApproval, LocalRunner
from callgate.tools import results
from callgate.tools.registry import (
    READ_ONLY,
    ExecutionContext,
    Principal,
    Registry,
    ResultLimits,
    Tool,
)
from callgate.worker.sandbox import Limits, python_tool, seccomp
from callgate.worker.sandbox.limits import Observed, limit_met
from callgate.worker.sandbox.tool import SANDBOX_UID_BASE, RunPython

LIMITS = Limits(wall_seconds=2, cpu_seconds=1)


@pytest.mark.parametrize(
    ("seen", "code"),
    [
        (Observed(timed_out=True, exit_code=None), ErrorCode.SANDBOX_TIMEOUT),
        (Observed(output_over=True), ErrorCode.SANDBOX_OUTPUT_LIMIT),
        (Observed(exit_code=128 + signal.SIGXCPU, duration=1.0), ErrorCode.SANDBOX_CPU),
        (Observed(exit_code=128 + signal.SIGKILL, duration=2.1), ErrorCode.SANDBOX_CPU),
        (Observed(exit_code=128 + signal.SIGXFSZ), ErrorCode.SANDBOX_FILES),
        (Observed(exit_code=1, error_type="MemoryError"), ErrorCode.SANDBOX_MEMORY),
        (
            Observed(exit_code=1, error_type="OSError", error_errno=errno.EFBIG),
            ErrorCode.SANDBOX_FILES,
        ),
        (
            Observed(exit_code=1, error_type="OSError", error_errno=errno.ENOSPC),
            ErrorCode.SANDBOX_FILES,
        ),
        (
            Observed(exit_code=1, error_type="BlockingIOError", error_errno=errno.EAGAIN),
            ErrorCode.SANDBOX_PROCESSES,
        ),
        (
            Observed(
                exit_code=1, error_type="RuntimeError", error_message="can't start new thread"
            ),
            ErrorCode.SANDBOX_PROCESSES,
        ),
        (Observed(exit_code=0, report_over=True), ErrorCode.SANDBOX_FILES),
    ],
)
def test_each_limit_has_its_code(seen: Observed, code: ErrorCode) -> None:
    met = limit_met(seen, LIMITS)
    assert met is not None and met[0] == code


@pytest.mark.parametrize(
    "seen",
    [
        Observed(exit_code=0),
        Observed(exit_code=1, error_type="ZeroDivisionError"),
        Observed(exit_code=1, error_type="FileNotFoundError", error_errno=errno.ENOENT),
        # Killed by itself at once: it cannot have used its CPU time.
        Observed(exit_code=128 + signal.SIGKILL, duration=0.05),
    ],
)
def test_the_codes_own_failures_are_not_limits(seen: Observed) -> None:
    assert limit_met(seen, LIMITS) is None


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ConfigurationError, match="wall_seconds"):
        Limits(wall_seconds=0)
    with pytest.raises(ConfigurationError, match="64 MiB"):
        Limits(memory_bytes=1 << 20)


def test_the_seccomp_program_checks_the_architecture_and_denies_ptrace() -> None:
    raw = seccomp.program()
    insns = [struct.unpack("<HBBI", raw[i : i + 8]) for i in range(0, len(raw), 8)]
    assert insns[0] == (0x20, 0, 0, 4)  # load the architecture
    assert insns[1][3] == 0xC000003E  # x86-64, or the last instruction: kill
    assert 1 + 1 + insns[1][2] == len(insns) - 1 and insns[-1] == (0x06, 0, 0, 0x80000000)
    eperm = len(insns) - 3
    tests = {k: i for i, (op, _, _, k) in enumerate(insns) if op == 0x15 and i > 1}
    ptrace = tests[seccomp.DENIED["ptrace"]]
    assert ptrace + 1 + insns[ptrace][1] == eperm
    assert insns[eperm] == (0x06, 0, 0, 0x00050000 | errno.EPERM)
    assert len(tests) == len(seccomp.DENIED) + len(seccomp.NOT_IMPLEMENTED)


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def _image_tool(max_image_bytes: int) -> Tool:
    return Tool(
        "t",
        "t",
        {},
        "read",
        lambda a, c: {},
        effect=READ_ONLY,
        limits=ResultLimits(max_image_bytes=max_image_bytes),
    )


def test_an_image_passes_whole_only_when_it_is_one_and_fits() -> None:
    data = base64.b64encode(PNG).decode()
    image = {"name": "p.png", "mime_type": "image/png", "data_base64": data}
    payload, notes = results.safe_result(_image_tool(1024), {"files": [image]})
    assert payload["content"]["files"][0]["data_base64"] == data and notes == []
    # Not allowed by the tool, too large, or not what it says it is: withheld.
    for tool, shown in (
        (_image_tool(0), image),
        (_image_tool(16), image),
        (_image_tool(1024), {**image, "mime_type": "image/jpeg"}),
        (_image_tool(1024), {**image, "mime_type": "text/plain"}),
        (_image_tool(1024), {**image, "data_base64": "sk-" + "a" * 40}),
    ):
        payload, notes = results.safe_result(tool, {"files": [shown]})
        assert payload["content"]["files"][0]["data_base64"] is None
        assert "image_withheld" in notes


def test_without_bwrap_it_refuses_to_register(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigurationError, match="bwrap and prlimit not found") as caught:
        python_tool()
    assert caught.value.code == ErrorCode.INVALID_CONFIGURATION


def test_where_bwrap_cannot_build_a_sandbox_it_refuses_to_register(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bwrap that fails as it does where user namespaces are off (a real executable, in a
    # folder the sandbox's user can reach).
    tmp_path = Path(tempfile.mkdtemp(prefix="fake-bwrap-", dir="/tmp"))
    tmp_path.chmod(0o755)
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    prlimit = tmp_path / "prlimit"
    prlimit.symlink_to("/usr/bin/prlimit")
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        with pytest.raises(ConfigurationError, match="uid map: Permission denied"):
            python_tool()
    finally:
        shutil.rmtree(tmp_path)


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


def _sandboxed_pids() -> list[int]:
    """Processes running as a sandbox slot's uid (a root worker's sandboxes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid_line = next(
                    line
                    for line in (entry / "status").read_text().splitlines()
                    if line.startswith("Uid:")
                )
            except (OSError, StopIteration):
                continue
            if int(uid_line.split()[1]) >= SANDBOX_UID_BASE:
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
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10
        while not _sandboxed_pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _sandboxed_pids(), "the sandbox never started"
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 5
    while _sandboxed_pids() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _sandboxed_pids() == []
