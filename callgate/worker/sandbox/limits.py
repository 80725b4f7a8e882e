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
# The longest snippet ``run_python`` accepts, in characters (at most 4 UTF-8 bytes each).
CODE_CHARS = 100_000


@dataclass(frozen=True)
class Limits:
    """Per run. Sizes in bytes, times in seconds."""

    wall_seconds: float = 10.0  # wall clock, from start to the whole sandbox killed
    cpu_seconds: int = 10  # RLIMIT_CPU
    memory_bytes: int = 256 * MiB  # RLIMIT_AS: address space of each process
    max_processes: int = 8  # RLIMIT_NPROC: processes and threads of the sandbox's user
    max_file_bytes: int = 16 * MiB  # RLIMIT_FSIZE: the largest file it may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    scratch_bytes: int = 64 * MiB  # /tmp and /dev/shm together, each a tmpfs of fixed size
    shm_bytes: int = 1 * MiB  # of scratch_bytes, the part that is /dev/shm
    scratch_inodes: int = 16_384  # files, folders and links /tmp may hold (nr_inodes)
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
        if self.shm_bytes >= self.scratch_bytes:
            raise ConfigurationError(
                f"sandbox limit shm_bytes={self.shm_bytes} must be less than scratch_bytes="
                f"{self.scratch_bytes}: /dev/shm is carved out of the scratch space, /tmp "
                "gets the rest"
            )


def report_bytes(limits: Limits) -> int:
    """The most the worker reads of a run's report: the files in base64, a line per file
    and the first line."""
    return limits.output_file_bytes * 4 // 3 + 512 * limits.output_files + 16_384


# Per task: its kernel stack (16 KiB) and task structures, rounded up.
TASK_BYTES = 64 * 1024
# RLIMIT_SIGPENDING of a slot's uid: signals queued and POSIX timers (each holds one queued
# signal in advance), each well under 1 KiB of kernel memory.
PENDING_SIGNALS = 256
SIGNAL_BYTES = 1024
# An inode of a tmpfs, its dentry and a name of up to 255 bytes (1,044 bytes a file measured).
INODE_BYTES = 2048
# An inotify watch and the inode it keeps in memory (without seccomp only: it denies inotify).
WATCH_BYTES = 1024
# Files, folders and links /dev/shm and /output may each hold (their root included).
SMALL_MOUNT_INODES = 1_024


@dataclass(frozen=True)
class Host:
    """What of this machine's settings bounds a run's kernel memory (read by ``host.read``).
    The defaults are a kernel's own."""

    wmem_default: int = 212_992  # net.core.wmem_default: a Unix socket's send buffer
    wmem_max: int = 212_992  # net.core.wmem_max: the most SO_SNDBUF may set
    inotify_watches: int = 8_192  # fs.inotify.max_user_watches
    tmpfs_inodes: int = 1 << 20  # a tmpfs's nr_inodes unless set: half the memory's pages


def descriptor_bytes(host: Host, seccomp: bool) -> int:
    """The most kernel memory one descriptor can hold, once the filter has left Unix sockets
    and pipes of the default size only: a Unix socket's send buffer (doubled by the kernel)
    and one message past it, at most half of it again. With the filter, ``setsockopt`` may
    not size it, so it stays at ``wmem_default``; without, it goes up to ``wmem_max``. A
    pipe holds 64 KiB."""
    return 3 * (host.wmem_default if seccomp else max(host.wmem_default, host.wmem_max))


def slot_memory(
    limits: Limits, host: Host | None = None, *, seccomp: bool = True, inodes_bounded: bool = True
) -> dict[str, int]:
    """The most memory one run can hold at once, term by term, in bytes, on ``host`` (a
    kernel's defaults unless given); a worker holds ``max_concurrent`` times their sum.
    ``inodes_bounded``: a root worker caps each writable mount's inodes; a worker of another
    user cannot, and its mounts hold up to the host's default number. Not counted: whatever
    a cgroup of your own limits further."""
    host = host or Host()
    mount_inodes = limits.scratch_inodes + 2 * SMALL_MOUNT_INODES
    return {
        # RLIMIT_AS bounds each process, not their sum: anonymous memory, mapped files,
        # shared mappings.
        "address_space": limits.max_processes * limits.memory_bytes,
        # Page tables (8 bytes per 4 KiB page mapped) and each task's kernel stack.
        "kernel_per_process": limits.max_processes * (limits.memory_bytes // 512 + TASK_BYTES),
        "scratch": limits.scratch_bytes,  # the /tmp and /dev/shm tmpfs mounts
        "output": limits.output_file_bytes,  # the /output tmpfs
        # Files, folders and links in those three mounts, whatever their sizes.
        "inodes": (mount_inodes if inodes_bounded else 3 * host.tmpfs_inodes) * INODE_BYTES,
        # bwrap copies the attached files and the snippet into the sandbox's own root.
        "inputs": limits.input_bytes + 4 * CODE_CHARS,
        # Every process's descriptors, and up to RLIMIT_NOFILE more in flight in Unix
        # sockets (the kernel's cap per user).
        "descriptors": (limits.max_processes + 1)
        * limits.max_open_files
        * descriptor_bytes(host, seccomp),
        # Queued signals and POSIX timers (RLIMIT_SIGPENDING).
        "signals": PENDING_SIGNALS * SIGNAL_BYTES,
        # Without the filter, inotify watches up to the host's per-user cap.
        "inotify": 0 if seccomp else host.inotify_watches * WATCH_BYTES,
        # What the worker buffers of stdout, stderr and the report.
        "worker": 2 * limits.output_bytes + report_bytes(limits),
    }


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
