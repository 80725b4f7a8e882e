"""A seccomp filter for the sandbox, as classic BPF bytes for ``bwrap --seccomp FD``. Pure.

A deny list on top of the namespaces: system calls the snippet has no use for and that are
the usual first step of a kernel exploit or an escape (tracing another process, mounting,
new namespaces, kernel keyrings, eBPF, perf, userfaultfd, io_uring, modules, kexec, raw
file handles). Each fails with ``EPERM``; ``clone3`` fails with ``ENOSYS`` so the C library
falls back to ``clone`` (threads keep working). A call from another architecture or from the
x32 ABI kills the process: the numbers below are x86-64's. Hand-assembled, so the sandbox
needs no seccomp library; on another machine ``available()`` is false and the tool refuses
to register (or runs with ``seccomp=False``, said out loud).
"""

from __future__ import annotations

import errno
import platform
import struct

# x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
DENIED: dict[str, int] = {
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "unshare": 272,
    "setns": 308,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "reboot": 169,
    "swapon": 167,
    "swapoff": 168,
    "acct": 163,
    "syslog": 103,
    "quotactl": 179,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "iopl": 172,
    "ioperm": 173,
    "settimeofday": 164,
    "clock_settime": 227,
    "adjtimex": 159,
    "lookup_dcookie": 212,
    "fanotify_init": 300,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
NOT_IMPLEMENTED = {"clone3": 435}

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
# struct seccomp_data: int nr; __u32 arch; ...
_NR, _ARCH = 0, 4


def available() -> bool:
    """Whether this filter's numbers are this machine's."""
    return platform.machine() in ("x86_64", "AMD64")


def program() -> bytes:
    """The filter as ``struct sock_filter`` records (what ``bwrap --seccomp`` reads)."""
    denied = sorted(DENIED.values())
    absent = sorted(NOT_IMPLEMENTED.values())
    n = len(denied) + len(absent)
    # Layout: 0 load arch; 1 arch check; 2 load nr; 3 x32 check; 4.. one test each;
    # then allow, EPERM, ENOSYS, kill.
    allow = 4 + n
    eperm, enosys, kill = allow + 1, allow + 2, allow + 3
    code: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 0, kill - 2, _AUDIT_ARCH_X86_64),
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE, kill - 4, 0, _X32_BIT),
    ]
    for nr in denied:
        at = len(code)
        code.append((_JEQ, eperm - at - 1, 0, nr))
    for nr in absent:
        at = len(code)
        code.append((_JEQ, enosys - at - 1, 0, nr))
    code += [
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, _RET_ERRNO | errno.EPERM),
        (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
        (_RET, 0, 0, _RET_KILL_PROCESS),
    ]
    return b"".join(struct.pack("<HBBI", *insn) for insn in code)
