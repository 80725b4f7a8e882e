"""The sandbox's limits and how a run that met one is named. Pure: no I/O.

Each limit has a default and a per-tool setting (``Limits(...)`` given to ``python_tool``).
Which limit a run met is decided outside the sandbox, from what the worker saw: the wall
clock, the bytes it read, the process's exit status and CPU time; only the codes for an
allocation, a fork or a write that failed inside (a ``MemoryError``, ``EAGAIN``, ``EFBIG``)
come from the run's own report, and forging one changes nothing but that run's own result.
"""

from __future__ import annotations

import errno
import signal
from dataclasses import dataclass, fields

from callgate.core.errors import ConfigurationError, ErrorCode

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per run. Sizes in bytes, times in seconds."""

    wall_seconds: float = 10.0  # wall clock, from start to the whole sandbox killed
    cpu_seconds: int = 10  # RLIMIT_CPU
    memory_bytes: int = 512 * MiB  # RLIMIT_AS: address space of each process
    max_processes: int = 32  # RLIMIT_NPROC: processes and threads of the sandbox's user
    max_file_bytes: int = 16 * MiB  # RLIMIT_FSIZE: the largest file it may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    scratch_bytes: int = 64 * MiB  # the size of the /tmp tmpfs (the scratch folder)
    output_bytes: int = 64 * 1024  # stdout and stderr, each
    output_files: int = 8  # files collected from /output
    output_file_bytes: int = 4 * MiB  # their total size (and the /output tmpfs)
    input_bytes: int = 64 * MiB  # the attached input files, together

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigurationError(
                    f"sandbox limit {f.name} must be a positive number, not {value!r}"
                )
        if self.memory_bytes < 64 * MiB:
            raise ConfigurationError(
                f"sandbox limit memory_bytes={self.memory_bytes} is below 64 MiB: the "
                "interpreter alone does not start in less"
            )


@dataclass(frozen=True)
class Observed:
    """What the worker saw of one run."""

    timed_out: bool = False
    output_over: bool = False  # stdout or stderr passed output_bytes
    report_over: bool = False  # the output files passed their caps
    exit_code: int | None = None  # the sandbox's status: 128 + N for signal N
    duration: float = 0.0  # seconds from start to exit
    error_type: str | None = None  # the exception that ended the snippet, if any
    error_errno: int | None = None
    error_message: str = ""


_FILE_ERRNOS = frozenset({errno.EFBIG, errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.EDQUOT})


def limit_met(seen: Observed, limits: Limits) -> tuple[ErrorCode, str] | None:
    """The stable code of the limit this run met, and a message naming it; None if none."""
    if seen.timed_out:
        return (
            ErrorCode.SANDBOX_TIMEOUT,
            f"the run passed its wall-clock limit of {limits.wall_seconds:g} s",
        )
    if seen.output_over:
        return (
            ErrorCode.SANDBOX_OUTPUT_LIMIT,
            f"stdout or stderr passed {limits.output_bytes} bytes; the run was stopped",
        )
    killed_by = (seen.exit_code or 0) - 128
    # SIGXCPU at the soft limit, SIGKILL one second later at the hard one (a snippet may
    # ignore SIGXCPU). A process cannot use more CPU time than the time it ran.
    if killed_by == signal.SIGXCPU or (
        killed_by == signal.SIGKILL and seen.duration >= limits.cpu_seconds
    ):
        return ErrorCode.SANDBOX_CPU, f"the run used its {limits.cpu_seconds} s of CPU time"
    if killed_by == signal.SIGXFSZ:
        return ErrorCode.SANDBOX_FILES, f"a file passed {limits.max_file_bytes} bytes"
    if seen.error_type == "MemoryError":
        return (
            ErrorCode.SANDBOX_MEMORY,
            f"an allocation failed at the memory limit of {limits.memory_bytes // MiB} MiB",
        )
    if seen.error_errno in _FILE_ERRNOS:
        return (
            ErrorCode.SANDBOX_FILES,
            "a file system limit was met: file size, open files or scratch space",
        )
    if (seen.error_type == "BlockingIOError" and seen.error_errno == errno.EAGAIN) or (
        seen.error_type == "RuntimeError" and "can't start new thread" in seen.error_message
    ):
        return (
            ErrorCode.SANDBOX_PROCESSES,
            f"a process or thread could not start at the limit of {limits.max_processes}",
        )
    if seen.report_over:
        return (
            ErrorCode.SANDBOX_FILES,
            f"the output folder held more than {limits.output_files} files or "
            f"{limits.output_file_bytes} bytes",
        )
    return None
