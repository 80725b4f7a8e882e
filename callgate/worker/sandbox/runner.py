"""One sandboxed run: open its descriptors, start ``prlimit … bwrap …``, cap its mounts'
inodes before the snippet starts, read stdout, stderr and the report with caps while the
wall clock runs, kill the whole sandbox at the first limit, and say what happened.

Killing a sandbox is ``SIGKILL`` to the interpreter, PID 1 of its namespace: the kernel then
kills every process left in the namespace, however it forked or re-parented, and bwrap reaps
it and exits (its session's process group is the fallback). A run returns only once bwrap
has exited, hence once every process of its namespace is gone. If the worker itself dies,
the lifeline ends the sandbox: a Unix socket whose one end only the worker holds, watched
by the sandbox's PID 1 (boot.py) from before the snippet starts; ``bwrap
--die-with-parent`` stands behind it.
Nothing is buffered past its cap: a run printing a gibibyte costs the worker at most
``output_bytes`` of memory per stream.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from callgate.worker.sandbox import command, host, seccomp
from callgate.worker.sandbox.limits import Limits, Observed, report_bytes

CHUNK = 65536
# After every stream has closed, how long the sandbox gets to exit before it is killed.
EXIT_GRACE = 1.0


@dataclass(frozen=True)
class Setup:
    """Everything one run needs besides the snippet and its inputs."""

    view: command.View
    limits: Limits
    env: Mapping[str, str]
    bwrap: str
    prlimit: str
    # The first (uid, gid) to run as when the worker is root; slot N runs as (uid+N, gid+N).
    user: tuple[int, int] | None
    seccomp: bool = True
    # Cap each writable mount's inodes (root only: see host.cap_inodes).
    cap_inodes: bool = False


@dataclass
class Run:
    """What a run produced, as the worker read it (capped)."""

    seen: Observed
    stdout: bytes = b""
    stderr: bytes = b""
    value: str | None = None
    error: dict[str, Any] | None = None
    files: list[tuple[str, bytes]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    duration: float = 0.0


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)  # pass_fds hands it to bwrap alone
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def run(setup: Setup, code: str, inputs: Mapping[str, bytes], slot: int = 0) -> Run:
    """Run ``code`` with ``inputs`` (name → bytes) in a new sandbox, as slot ``slot``'s user.
    Returns within ``wall_seconds`` (and a grace second); the sandbox is gone by then."""
    opened: list[int] = []

    def keep(fd: int) -> int:
        opened.append(fd)
        return fd

    lifeline, inside = socket.socketpair()
    try:
        report_r, report_w = os.pipe()
        opened += [report_r, report_w]
        fds = command.Fds(
            snippet=keep(_memfd("snippet", code.encode("utf-8", "surrogatepass"))),
            report=report_w,
            lifeline=inside.fileno(),
            inputs={name: keep(_memfd("input", data)) for name, data in inputs.items()},
            seccomp=keep(_memfd("seccomp", seccomp.program())) if setup.seccomp else None,
        )
        args = command.argv(
            setup.view, setup.limits, fds, setup.env, bwrap=setup.bwrap, prlimit=setup.prlimit
        )
        passed = (fds.snippet, fds.report, fds.lifeline, *fds.inputs.values())
        if fds.seccomp is not None:
            passed += (fds.seccomp,)
        user: dict[str, Any] = {}
        if setup.user is not None:
            uid, gid = setup.user[0] + slot, setup.user[1] + slot
            user = {"user": uid, "group": gid, "extra_groups": []}
        started = time.monotonic()
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=passed,
            start_new_session=True,
            env={},
            cwd="/",
            **user,
        )
        inside.close()  # the worker keeps one end only: its death closes the lifeline
        for fd in passed:
            if fd in opened:
                os.close(fd)
                opened.remove(fd)
        try:
            _start(proc, lifeline, setup, started + setup.limits.wall_seconds)
            return _watch(proc, report_r, setup.limits, started)
        finally:
            _kill(proc)
    finally:
        lifeline.close()
        inside.close()
        for fd in opened:
            with contextlib.suppress(OSError):
                os.close(fd)


def _start(
    proc: subprocess.Popen[bytes], lifeline: socket.socket, setup: Setup, deadline: float
) -> None:
    """Wait for the sandbox's PID 1 to say it has started, cap its mounts' inodes, and let
    the snippet run. Returns without a word when it never starts in time (or bwrap failed:
    the lifeline then reads end of file), leaving the wall clock and the exit status to tell."""
    lifeline.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        started = lifeline.recv(1)
    except (TimeoutError, OSError):
        return
    if started != b"R":
        return
    if setup.cap_inodes:
        children = _children(proc.pid)  # bwrap's one child, waiting for the word to go
        if len(children) != 1:
            raise OSError(f"bwrap has {len(children)} children, not the sandbox's PID 1 alone")
        host.cap_inodes(children[0], command.inodes(setup.limits))
    with contextlib.suppress(OSError):  # it may have been killed meanwhile
        lifeline.sendall(b"G")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Stop the sandbox (if it still runs) and close its streams."""
    _stop(proc)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the sandbox if it still runs, and reap bwrap.

    The sandboxed interpreter is bwrap's only child and PID 1 of its namespace
    (``--as-pid-1``): killed first, it takes every process of the namespace with it, and
    bwrap reaps it and exits. Killing bwrap first would orphan it (its zombie would count
    against the uid's ``RLIMIT_NPROC`` until some init reaped it). The process group is the
    fallback."""
    if proc.returncode is None:
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + EXIT_GRACE
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _watch(proc: subprocess.Popen[bytes], report_fd: int, limits: Limits, started: float) -> Run:
    assert proc.stdout is not None and proc.stderr is not None
    caps = {
        proc.stdout.fileno(): limits.output_bytes,
        proc.stderr.fileno(): limits.output_bytes,
        report_fd: report_bytes(limits),
    }
    got: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    deadline = started + limits.wall_seconds
    timed_out = output_over = report_over = False
    with selectors.DefaultSelector() as sel:
        for fd in caps:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(left, 0.5)):
                fd = int(key.fd)
                try:
                    chunk = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                room = caps[fd] - len(got[fd])
                got[fd] += chunk[: max(room, 0)]
                if len(chunk) > room:
                    if fd == report_fd:
                        report_over = True
                    else:
                        output_over = True
            if output_over or report_over:
                break  # stop it now: reading on would only wait for the wall clock
    duration = time.monotonic() - started
    stopped = timed_out or output_over or report_over
    status = _reap(proc, 0.0 if stopped else deadline)
    if status is None:  # still running at the deadline, its streams closed
        timed_out = timed_out or not output_over
    run = Run(
        seen=Observed(
            timed_out=timed_out,
            output_over=output_over,
            report_over=report_over,
            exit_code=status,
            duration=duration,
        ),
        stdout=bytes(got[proc.stdout.fileno()]),
        stderr=bytes(got[proc.stderr.fileno()]),
        duration=duration,
    )
    if not stopped:
        _read_report(run, bytes(got[report_fd]), limits)
    return run


def _reap(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """Wait for the sandbox until ``deadline`` (+ a grace), kill it past that. Its status
    (bwrap's: 128 + N for signal N), or None when it had to be killed."""
    until = max(deadline, time.monotonic()) + (EXIT_GRACE if deadline else 0.0)
    while proc.poll() is None:
        if time.monotonic() >= until:
            _stop(proc)
            return None
        time.sleep(0.005)
    code = proc.returncode
    return 128 - code if code < 0 else code


def _read_report(run: Run, raw: bytes, limits: Limits) -> None:
    """The bootstrap's report: untrusted lines, every field checked, every cap applied."""
    lines = raw.decode("utf-8", "replace").splitlines()
    if not lines:
        return
    try:
        head = json.loads(lines[0])
    except ValueError:
        return
    if isinstance(head, dict):
        value = head.get("value")
        run.value = value if isinstance(value, str) else None
        error = head.get("error")
        if isinstance(error, dict):
            run.error = {
                "type": str(error.get("type", ""))[:100],
                "message": str(error.get("message", ""))[: command.REPORT_VALUE_CHARS],
                "line": error.get("line") if isinstance(error.get("line"), int) else None,
            }
            eno = error.get("errno")
            run.seen = _with_error(run.seen, run.error, eno if isinstance(eno, int) else None)
    total = 0
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("over") is True:
            run.seen = _replace(run.seen, report_over=True)
            continue
        if isinstance(entry.get("skipped"), str):
            run.skipped.append(entry["skipped"][:200])
            continue
        name, data = entry.get("name"), entry.get("data")
        if not isinstance(name, str) or not isinstance(data, str):
            continue
        try:
            content = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            continue
        total += len(content)
        if len(run.files) >= limits.output_files or total > limits.output_file_bytes:
            run.seen = _replace(run.seen, report_over=True)
            break
        run.files.append((name[:200], content))


def _with_error(seen: Observed, error: Mapping[str, Any], eno: int | None) -> Observed:
    return _replace(seen, error_type=error["type"], error_errno=eno, error_message=error["message"])


def _replace(seen: Observed, **changes: Any) -> Observed:
    return replace(seen, **changes)


def read_inputs(paths: Mapping[str, Path], limit: int) -> dict[str, bytes]:
    """The attached files' bytes, read by the worker (the sandbox never opens a host path):
    what the code sees is what was read here, at most ``limit`` bytes together."""
    out: dict[str, bytes] = {}
    total = 0
    for name, path in paths.items():
        with open(path, "rb") as f:
            data = f.read(limit - total + 1)
        total += len(data)
        if total > limit:
            raise ValueError(f"the attached files are larger than {limit} bytes together")
        out[name] = data
    return out
