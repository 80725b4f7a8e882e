"""``python_tool``: the built-in code-execution tool, a read that runs a Python snippet in a
sandbox and returns what it printed, the value of its last expression and the files it wrote.

Registered like any other tool (``Registry.of([python_tool(), ...], allowlist)``): the gate,
the allowlist, budgets, the trace and safe results (redaction, the untrusted-data label)
apply unchanged. Building it checks the sandbox can be built on this machine, by building
one: without ``bwrap``, ``prlimit``, user namespaces or a readable interpreter it raises
``ConfigurationError`` (``invalid_configuration``) naming what is missing, and no tool
exists that could run code unsandboxed.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
import mimetypes
import os
import queue
import re
import shutil
import stat
import sys
import sysconfig
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from callgate.core.errors import ConfigurationError, ErrorCode, ToolError
from callgate.tools import results
from callgate.tools.registry import (
    READ_ONLY,
    ExecutionContext,
    Facts,
    Principal,
    ResultLimits,
    RiskPolicy,
    Tool,
)
from callgate.worker.sandbox import command, host, packages, runner, seccomp
from callgate.worker.sandbox.limits import CODE_CHARS, Limits, limit_met, slot_memory

log = logging.getLogger("callgate.worker")

# The sandboxes of a root worker run as uid/gid BASE + slot, one id per concurrent slot:
# RLIMIT_NPROC counts per user, so each sandbox gets its own process budget and a fork bomb
# in one cannot starve the next. Far above ordinary accounts; no account is needed.
SANDBOX_UID_BASE = 2_000_000
_INPUT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
DESCRIPTION = (
    "Run a Python 3 snippet in an isolated sandbox: no network, no host files, an empty "
    "environment, limited CPU, memory, time and output. Attached files are read-only under "
    "/input; write files to return (e.g. PNG plots) to /output; /tmp is scratch space. "
    "Returns exit_code, stdout, stderr, the repr of a last expression as value, the error "
    "that ended the code, and the output files (images as base64 with their MIME type)."
)
Inputs = Mapping[str, Path] | Callable[[ExecutionContext], Mapping[str, Path]]


class RunPython(BaseModel):
    model_config = ConfigDict(extra="forbid")
    code: str = Field(min_length=1, max_length=CODE_CHARS, description="The Python source to run.")


class RunError(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    message: str
    line: int | None = None


class OutputFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    mime_type: str
    size: int
    data_base64: str | None = None  # an image: its bytes
    text: str | None = None  # a text file: its content


class RunResult(BaseModel):
    model_config = ConfigDict(extra="ignore")
    exit_code: int
    stdout: str
    stderr: str
    value: str | None = None
    error: RunError | None = None
    files: list[OutputFile] = []
    skipped_files: list[str] = []
    duration_ms: float


def python_tool(
    *,
    name: str = "run_python",
    description: str = DESCRIPTION,
    limits: Limits | None = None,
    packages: tuple[str, ...] | None = None,
    env: Mapping[str, str] | None = None,
    inputs: Inputs | None = None,
    max_concurrent: int = 2,
    interpreter: str | None = None,
    sandbox_uid_base: int = SANDBOX_UID_BASE,
    use_seccomp: bool = True,
    require_approval: bool = False,
    risk: RiskPolicy | None = None,
    version: str = "1",
) -> Tool:
    """The code-execution tool, checked on this machine. See docs/tools.md.

    ``packages`` names installed distributions the code may import (``None``: numpy, pandas
    and matplotlib where installed); ``env`` the only variables it sees (besides a fixed,
    harmless set); ``inputs`` the files attached read-only under ``/input`` (a mapping of
    name → host path, or a function of the call's context returning one); ``max_concurrent``
    the sandboxes this worker runs at once; ``require_approval`` (or your own ``risk``)
    parks each call for a person's approval first."""
    limits = limits or Limits()
    if max_concurrent < 1:
        raise ConfigurationError(f"{name}: max_concurrent must be at least 1")
    setup = _setup(
        name, limits, packages, dict(env or {}), interpreter, sandbox_uid_base, use_seccomp
    )
    _probe(name, setup)
    _say_memory(name, setup, max_concurrent)
    slots: queue.Queue[int] = queue.Queue()
    for slot in range(max_concurrent):
        slots.put(slot)

    def handler(args: RunPython, ctx: ExecutionContext) -> dict[str, Any]:
        attached = _inputs(name, inputs, ctx, limits)
        try:
            slot = slots.get(timeout=limits.wall_seconds)
        except queue.Empty:
            raise ToolError(
                f"all {max_concurrent} sandboxes of this worker are busy",
                code=ErrorCode.UPSTREAM_UNAVAILABLE,
            ) from None
        try:
            done = runner.run(setup, args.code, attached, slot=slot)
        finally:
            slots.put(slot)
        met = limit_met(done.seen, limits)
        if met is not None:
            code, message = met
            raise ToolError(message, code=code, details=_limit_details(code, message, done))
        return _result(done)

    policy = risk if risk is not None else (_always_approve if require_approval else None)
    return Tool(
        name=name,
        description=description,
        arguments=RunPython,
        kind="read",
        handler=handler,
        version=version,
        effect=READ_ONLY,
        result=RunResult,
        limits=ResultLimits(
            max_string=limits.output_bytes,
            max_items=max(limits.output_files, 20),
            max_image_bytes=limits.output_file_bytes,
        ),
        risk=policy,
    )


def _always_approve(args: Any, facts: Facts, principal: Principal) -> dict[str, Any]:
    code = args.code if isinstance(args, RunPython) else str(args)
    return {"action": "run model-written Python code in the sandbox", "code": code[:2_000]}


def _setup(
    name: str,
    limits: Limits,
    wanted: tuple[str, ...] | None,
    env: dict[str, str],
    interpreter: str | None,
    uid_base: int,
    use_seccomp: bool,
) -> runner.Setup:
    missing = [tool for tool in ("bwrap", "prlimit") if shutil.which(tool) is None]
    if missing:
        raise ConfigurationError(
            f"{name}: cannot build its sandbox: {' and '.join(missing)} not found on PATH "
            "(Debian: apt-get install bubblewrap util-linux); the tool runs no code without it"
        )
    if use_seccomp and not seccomp.available():
        raise ConfigurationError(
            f"{name}: its seccomp filter is written for x86-64, not this machine's "
            f"{os.uname().machine}; pass use_seccomp=False to run on the namespaces alone"
        )
    for key in env:
        if not _ENV_NAME.match(key) or key.startswith("CALLGATE_"):
            raise ConfigurationError(
                f"{name}: env name {key!r} is not allowed (a plain name, never CALLGATE_…)"
            )
    user = (uid_base, uid_base) if os.geteuid() == 0 else None
    uid, gid = user if user is not None else (os.geteuid(), os.getegid())
    site = packages.resolve(wanted)
    exe = _interpreter(name, interpreter, uid, gid)
    roots: tuple[Path, ...] = ()
    if not str(exe).startswith("/usr/"):
        roots = (exe.parent.parent,)
    for entry, path in site.items():
        if not packages.readable_by(path, uid, gid):
            raise ConfigurationError(
                f"{name}: package folder {path} ({entry}) is not readable by uid {uid}, "
                "which runs the sandbox; make it world-readable or leave the package out"
            )
    links: dict[str, str] = {}
    folders: list[str] = []
    for top in command.ROOT_LINKS:
        path = Path("/") / top
        if path.is_symlink():
            links[top] = os.readlink(path)
        elif path.is_dir():
            folders.append(top)
    hidden = tuple(name for name in command.HIDDEN_PROC if _readable_by_others(f"/proc/{name}"))
    return runner.Setup(
        view=command.View(
            interpreter=exe,
            roots=roots,
            site=site,
            links=links,
            folders=tuple(folders),
            hidden_proc=hidden,
        ),
        limits=limits,
        env=env,
        bwrap=str(shutil.which("bwrap")),
        prlimit=str(shutil.which("prlimit")),
        user=user,
        seccomp=use_seccomp,
        cap_inodes=user is not None,
    )


def _say_memory(name: str, setup: runner.Setup, max_concurrent: int) -> None:
    """The most this tool's sandboxes can hold, from this host's settings as they are now
    (``wmem_default``, ``wmem_max``, inotify's cap): logged once, for sizing the worker's
    own memory limit, which is what bounds their sum (see docs/tools.md)."""
    terms = slot_memory(
        setup.limits, host.read(), seccomp=setup.seccomp, inodes_bounded=setup.cap_inodes
    )
    per_slot = sum(terms.values())
    log.info(
        "%s: each sandbox can hold up to %.1f GiB (%s), %d at once; cgroup memory here: %s",
        name,
        per_slot / (1 << 30),
        ", ".join(f"{term} {size >> 20} MiB" for term, size in terms.items()),
        max_concurrent,
        host.cgroup_memory(),
    )


def _readable_by_others(path: str) -> bool:
    """Whether ``path`` exists and its mode lets anyone read it: bwrap cannot cover what the
    sandbox's new /proc does not hold, and what only root may read needs no cover."""
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _interpreter(name: str, configured: str | None, uid: int, gid: int) -> Path:
    """The interpreter the sandbox runs: the one configured, else this worker's own (its
    base installation, not the virtual environment), else the system's of the same version
    (compiled packages need the same minor version). It must be readable by the sandbox's
    user, who is not root."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if configured is not None:
        candidates = [Path(configured)]
    else:
        base = getattr(sys, "_base_executable", sys.executable)
        candidates = [Path(base), Path(sysconfig.get_config_var("BINDIR") or "/") / version]
        candidates += [Path("/usr/bin") / version, Path("/usr/local/bin") / version]
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        if real.is_file() and packages.readable_by(real, uid, gid):
            return real
    tried = ", ".join(str(c) for c in candidates)
    raise ConfigurationError(
        f"{name}: no Python interpreter the sandbox's user (uid {uid}) can read: tried "
        f"{tried}; install {version} where others can read it (e.g. Debian's python3) or pass "
        "interpreter="
    )


def _probe(name: str, setup: runner.Setup) -> None:
    """Build one sandbox and run nothing in it: what does not work here fails now."""
    probe_limits = Limits(wall_seconds=max(setup.limits.wall_seconds, 10.0))
    try:
        done = runner.run(
            dataclasses.replace(setup, limits=probe_limits),
            "import sys\nprint(sys.version_info[0])",
            {},
        )
    except OSError as exc:  # prlimit or bwrap cannot be started by the sandbox's user
        raise ConfigurationError(
            f"{name}: cannot start its sandbox ({setup.prlimit} {setup.bwrap}): {exc}"
        ) from None
    if done.seen.exit_code == 0 and done.stdout.strip() == b"3":
        return
    why = done.stderr.decode("utf-8", "replace").strip()[:500] or f"exit {done.seen.exit_code}"
    raise ConfigurationError(
        f"{name}: cannot build its sandbox on this machine ({why}); user namespaces may be "
        "disabled (kernel.unprivileged_userns_clone, user.max_user_namespaces) or bwrap may "
        "lack what it needs. The tool runs no code without it"
    )


def _inputs(
    name: str, inputs: Inputs | None, ctx: ExecutionContext, limits: Limits
) -> dict[str, bytes]:
    if inputs is None:
        return {}
    chosen = inputs(ctx) if callable(inputs) else inputs
    for key in chosen:
        if not _INPUT_NAME.match(key):
            raise ToolError(
                f"{name}: input name {key!r} is not a plain file name",
                code=ErrorCode.INVALID_INPUT,
            )
    try:
        return runner.read_inputs({k: Path(v) for k, v in chosen.items()}, limits.input_bytes)
    except ValueError as exc:
        raise ToolError(str(exc), code=ErrorCode.SANDBOX_FILES) from None


# How much of stdout and stderr a limit's failure shows (the start of each, marked as cut).
HEAD_CHARS = 160


def _limit_details(code: str, message: str, done: runner.Run) -> list[dict[str, Any]]:
    """The limit, then the start of what the run printed before it (redacted like every
    detail), so the model sees how far it got."""
    details: list[dict[str, Any]] = [{"code": code, "message": message}]
    for stream, data in (("stdout", done.stdout), ("stderr", done.stderr)):
        if data:
            text = data.decode("utf-8", "replace")
            cut = f"…[cut: {len(data)} bytes read]" if len(text) > HEAD_CHARS else ""
            details.append({"code": f"sandbox_{stream}", "message": text[:HEAD_CHARS] + cut})
    return details


def _result(done: runner.Run) -> dict[str, Any]:
    files = []
    for name, data in done.files:
        # An image by what a decoder reads, not by its name: a .png holding HTML is a file.
        image = results.image_type(data)
        mime = image or mimetypes.guess_type(name)[0] or "application/octet-stream"
        if image is None and mime.startswith("image/"):
            mime = "application/octet-stream"
        entry: dict[str, Any] = {"name": name, "mime_type": mime, "size": len(data)}
        if image is not None:
            entry["data_base64"] = base64.b64encode(data).decode()
        else:
            # Other bytes are not returned: only their name, type and size.
            with contextlib.suppress(UnicodeDecodeError):
                entry["text"] = data.decode("utf-8")
        files.append(entry)
    code = done.seen.exit_code
    return {
        "exit_code": code if code is not None else -1,
        "stdout": done.stdout.decode("utf-8", "replace"),
        "stderr": done.stderr.decode("utf-8", "replace"),
        "value": done.value,
        "error": done.error,
        "files": files,
        "skipped_files": done.skipped,
        "duration_ms": round(done.duration * 1000, 1),
    }
