"""What this machine lets a sandbox hold beyond its own limits, read once at start: the
sysctls that size a Unix socket's buffers and inotify, a tmpfs's default inode count, and
which cgroups could cap a worker's memory. Also the kernel calls that cap a tmpfs mount's
inodes from outside it, since bwrap has no option for ``nr_inodes``."""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

from callgate.worker.sandbox.limits import Host

_PAGE = os.sysconf("SC_PAGE_SIZE")
# x86-64 numbers (the seccomp filter is x86-64's too); fsconfig's commands (linux/mount.h).
_FSPICK, _FSCONFIG = 433, 431
_FSPICK_CLOEXEC, _FSPICK_NO_AUTOMOUNT, _FSPICK_SYMLINK_NOFOLLOW = 1, 4, 2
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_RECONFIGURE = 1, 7
_AT_FDCWD = -100


def _number(path: str, default: int) -> int:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def read() -> Host:
    """This machine's figures, a kernel's defaults for those it does not show."""
    base = Host()
    pages = os.sysconf("SC_PHYS_PAGES")
    return Host(
        wmem_default=_number("/proc/sys/net/core/wmem_default", base.wmem_default),
        wmem_max=_number("/proc/sys/net/core/wmem_max", base.wmem_max),
        inotify_watches=_number("/proc/sys/fs/inotify/max_user_watches", base.inotify_watches),
        tmpfs_inodes=pages // 2 if pages > 0 else base.tmpfs_inodes,
    )


def cgroup_memory() -> str:
    """How a memory cap could be put on this worker's sandboxes: ``"v2"`` when the unified
    hierarchy is mounted at /sys/fs/cgroup with its memory controller enabled for this
    process's own cgroup's children and that cgroup writable (delegated); ``"v1"`` when only
    the legacy memory controller is there; ``"none"`` otherwise."""
    unified = Path("/sys/fs/cgroup")
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return "none"
    path = next((line[3:] for line in own if line.startswith("0::")), None)
    if path is not None and (unified / "cgroup.controllers").exists():
        mine = unified / path.lstrip("/")
        try:
            enabled = (mine / "cgroup.subtree_control").read_text().split()
        except OSError:
            enabled = []
        if "memory" in enabled and os.access(mine, os.W_OK):
            return "v2"
    if any(":memory:" in line for line in own):
        return "v1"
    return "none"


def cap_inodes(pid: int, mounts: dict[str, int]) -> None:
    """Set ``nr_inodes`` of each tmpfs mount in process ``pid``'s mount namespace, reached
    through ``/proc/<pid>/root`` (``fspick`` and ``fsconfig``, Linux 5.2). Needs
    CAP_SYS_ADMIN in this process's own mount namespace: a root worker. Raises ``OSError``."""
    libc = _libc()
    for mount, count in mounts.items():
        path = f"/proc/{pid}/root{mount}".encode()
        flags = _FSPICK_CLOEXEC | _FSPICK_NO_AUTOMOUNT | _FSPICK_SYMLINK_NOFOLLOW
        fd = libc.syscall(
            ctypes.c_long(_FSPICK), ctypes.c_long(_AT_FDCWD), path, ctypes.c_long(flags)
        )
        if fd < 0:
            raise _error(ctypes.get_errno(), f"fspick {mount}")
        try:
            _fsconfig(libc, int(fd), _FSCONFIG_SET_STRING, b"nr_inodes", str(count).encode())
            _fsconfig(libc, int(fd), _FSCONFIG_CMD_RECONFIGURE, None, None)
        finally:
            os.close(int(fd))


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _fsconfig(libc: ctypes.CDLL, fd: int, cmd: int, key: bytes | None, value: bytes | None) -> None:
    got = libc.syscall(
        ctypes.c_long(_FSCONFIG),
        ctypes.c_long(fd),
        ctypes.c_long(cmd),
        key,
        value,
        ctypes.c_long(0),
    )
    if got < 0:
        raise _error(ctypes.get_errno(), f"fsconfig {key!r}")


def _error(number: int, what: str) -> OSError:
    return OSError(number, f"{what}: {os.strerror(number)}")
