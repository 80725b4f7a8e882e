"""The command line that builds one sandbox: ``prlimit`` for the resource limits, then
``bwrap`` for the namespaces, the file system view, the environment and seccomp. Pure: the
argument vector from typed values; the file descriptors it names are the runner's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from callgate.worker.sandbox.boot import BOOT
from callgate.worker.sandbox.limits import PENDING_SIGNALS, SMALL_MOUNT_INODES, Limits

SITE = "/opt/site"
SNIPPET = "/sandbox/snippet.py"
INPUT = "/input"
OUTPUT = "/output"
SCRATCH = "/tmp"
# Inside only; none of it is the worker's. Single-threaded numeric libraries: a thread pool
# per core would meet max_processes at once.
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": SCRATCH,
    "LANG": "C.UTF-8",
    "TMPDIR": SCRATCH,
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": f"{SCRATCH}/.matplotlib",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
# The top-level names a merged-/usr system links into /usr, as the host has them.
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
REPORT_VALUE_CHARS = 2_000
# /dev is built by hand rather than with bwrap's --dev, whose tmpfs is writable and as large
# as half the host's memory, and holds a pty multiplexer: the devices Python uses, bound from
# the host, the usual links, a sized /dev/shm, and the rest read-only.
DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}
DEV_BYTES = 64 * 1024  # holds only mount points and links; read-only once built
# Global /proc files that tell about the host rather than the run: kernel symbols and
# configuration, the boot command line, modules, the physical memory map and allocator
# state, the host's devices, disks and interrupts. Each one this kernel has that others may
# read is covered with the host's /dev/null, bound without device access, so opening it
# fails (EACCES); those only root may read are unreadable inside already. Each is a mount
# at start-up, hence a short list.
HIDDEN_PROC = (
    "kallsyms", "config.gz", "cmdline", "modules", "iomem", "zoneinfo", "buddyinfo",
    "pagetypeinfo", "timer_list", "sched_debug", "misc", "devices", "partitions",
    "diskstats", "interrupts",
)  # fmt: skip


@dataclass(frozen=True)
class View:
    """What the sandbox sees of the host, all read-only."""

    interpreter: Path
    # Bound at their own path: the interpreter's installation when it is not under /usr.
    roots: tuple[Path, ...] = ()
    # ``/opt/site/<name>`` → host path.
    site: Mapping[str, Path] = field(default_factory=dict)
    # Host links such as /lib → usr/lib, recreated inside; real folders are bound.
    links: Mapping[str, str] = field(default_factory=dict)
    folders: tuple[str, ...] = ()
    # Names under /proc to cover: those of HIDDEN_PROC this kernel has and others may read.
    hidden_proc: tuple[str, ...] = ()


def inodes(limits: Limits) -> dict[str, int]:
    """The most inodes each writable tmpfs may hold (``nr_inodes``). Each costs about 1 KiB
    of kernel memory whatever the mount's size, and user xattrs would be charged to the same
    space: without a cap, half the host's memory pages per mount."""
    return {
        SCRATCH: limits.scratch_inodes,
        "/dev/shm": SMALL_MOUNT_INODES,
        OUTPUT: SMALL_MOUNT_INODES,
    }


@dataclass(frozen=True)
class Fds:
    """The descriptors the runner opened for this run (inherited by bwrap)."""

    snippet: int
    report: int
    lifeline: int  # the sandbox's end of the lifeline (see boot.py)
    inputs: Mapping[str, int] = field(default_factory=dict)
    seccomp: int | None = None


def argv(
    view: View, limits: Limits, fds: Fds, env: Mapping[str, str], *, bwrap: str, prlimit: str
) -> list[str]:
    rlimits = [
        prlimit,
        f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.max_processes}",
        f"--fsize={limits.max_file_bytes}",
        f"--nofile={limits.max_open_files}",
        # Queued signals and POSIX timers (each timer holds one in advance) of the slot's uid.
        f"--sigpending={PENDING_SIGNALS}",
        "--core=0",
        "--",
    ]
    box = [
        bwrap,
        "--unshare-all",  # user, mount, pid, network, ipc, uts, cgroup
        "--unshare-user",
        "--disable-userns",  # no user namespace of its own inside
        # bwrap dies with the worker's thread, and the interpreter with bwrap; the lifeline
        # (boot.py) covers the moments before bwrap has armed this, and any moment after.
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",  # no TIOCSTI into the worker's terminal
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name, target in sorted(view.links.items()):
        box += ["--symlink", target, f"/{name}"]
    for name in view.folders:
        box += ["--ro-bind", f"/{name}", f"/{name}"]
    for root in view.roots:
        box += ["--ro-bind", str(root), str(root)]
    for name, path in sorted(view.site.items()):
        box += ["--ro-bind", str(path), f"{SITE}/{name}"]
    box += ["--proc", "/proc"]  # this pid namespace's own
    for name in view.hidden_proc:
        box += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    box += ["--size", str(DEV_BYTES), "--tmpfs", "/dev"]
    for name in DEVICES:
        box += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in DEV_LINKS.items():
        box += ["--symlink", target, f"/dev/{name}"]
    box += [
        "--size",
        str(limits.shm_bytes),
        "--tmpfs",
        "/dev/shm",  # POSIX semaphores (multiprocessing's locks) and shared memory
        "--remount-ro",
        "/dev",  # that mount alone: /dev/shm below it stays writable
        "--size",
        str(limits.scratch_bytes - limits.shm_bytes),
        "--tmpfs",
        SCRATCH,
        "--size",
        str(limits.output_file_bytes),
        "--tmpfs",
        OUTPUT,
        "--ro-bind-data",
        str(fds.snippet),
        SNIPPET,
        "--dir",
        INPUT,
    ]
    for name, fd in sorted(fds.inputs.items()):
        box += ["--ro-bind-data", str(fd), f"{INPUT}/{name}"]
    box += ["--remount-ro", "/", "--clearenv"]
    for key, value in sorted({**BASE_ENV, **env}.items()):
        box += ["--setenv", key, value]
    box += ["--chdir", SCRATCH]
    if fds.seccomp is not None:
        box += ["--seccomp", str(fds.seccomp)]
    box += [
        "--",
        str(view.interpreter),
        "-I",
        "-S",
        "-B",
        "-c",
        BOOT,
        str(fds.report),
        str(fds.lifeline),
        str(limits.output_files),
        str(limits.output_file_bytes),
        str(REPORT_VALUE_CHARS),
    ]
    return rlimits + box
