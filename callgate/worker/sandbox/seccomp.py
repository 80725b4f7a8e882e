"""A seccomp filter for the sandbox, as classic BPF bytes for ``bwrap --seccomp FD``. Pure.

A deny list on top of the namespaces: system calls the snippet has no use for and that are
the usual first step of a kernel exploit or an escape (tracing or comparing other
processes, mounting, new namespaces, kernel keyrings, eBPF, perf, userfaultfd, io_uring,
modules, kexec, raw file handles, LDT entries, NUMA placement, Landlock and LSM
attributes). Each fails with ``EPERM``. Memory a run could hold outside its address-space
limit and its sized mounts (memfd, SysV shared memory, message queues and semaphores,
POSIX message queues, AIO rings, inotify watches) and features a library probes for and
does without (``clone3``, pidfds) fail with ``ENOSYS``, as on a kernel without them: the C
library falls back to ``clone``, so threads and subprocesses keep working. Extended
attributes fail with ``ENOTSUP``, as on a file system without them: on tmpfs a user xattr
is charged to the mount's inode space, not to its size, and Python's own copy functions
take ``ENOTSUP`` as "nothing to copy". Five calls are checked by argument: ``socket`` and
``socketpair`` make Unix sockets only (any other family, ``EAFNOSUPPORT``: no vsock,
netlink, packet or Internet socket, whose buffers would count against the host's TCP
memory), ``personality`` answers the query and keeps ``PER_LINUX`` (no turning
address-space randomisation off for a child), ``fcntl`` does not enlarge a pipe past its
default 64 KiB, ``setsockopt`` does not size a socket's buffers (they stay at
``net.core.wmem_default``, however high the host's ``wmem_max``), and ``prctl`` does not
change the signal a process gets when its parent dies (the sandbox's first process dies
with bwrap, which dies with the worker).

A deny list, not an allow list: the interpreter and compiled packages (numpy's BLAS,
matplotlib) use a wide set of calls that changes with the kernel and the C library, and a
call missing from an allow list breaks a package in a way that looks like a bug in the
user's code; the namespaces stand behind this filter. A call from another architecture or
from the x32 ABI kills the process: the numbers below are x86-64's. Hand-assembled, so the
sandbox needs no seccomp library; on another machine ``available()`` is false and the tool
refuses to register (or runs with ``seccomp=False``, said out loud).
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
    "kcmp": 312,
    "process_madvise": 440,
    "process_mrelease": 448,
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
    "quotactl_fd": 443,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "iopl": 172,
    "ioperm": 173,
    "modify_ldt": 154,
    "settimeofday": 164,
    "clock_settime": 227,
    "clock_adjtime": 305,
    "adjtimex": 159,
    "lookup_dcookie": 212,
    "fanotify_init": 300,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "open_tree_attr": 467,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "mbind": 237,
    "set_mempolicy": 238,
    "get_mempolicy": 239,
    "migrate_pages": 256,
    "move_pages": 279,
    "set_mempolicy_home_node": 450,
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
    "lsm_set_self_attr": 460,
    "uselib": 134,
    "ustat": 136,
    "sysfs": 139,
    "vhangup": 153,
}
NOT_IMPLEMENTED: dict[str, int] = {
    "clone3": 435,
    "pidfd_open": 434,
    "pidfd_getfd": 438,
    "memfd_create": 319,
    "memfd_secret": 447,
    "shmget": 29,
    "shmat": 30,
    "shmctl": 31,
    "shmdt": 67,
    "semget": 64,
    "semop": 65,
    "semctl": 66,
    "semtimedop": 220,
    "msgget": 68,
    "msgsnd": 69,
    "msgrcv": 70,
    "msgctl": 71,
    "mq_open": 240,
    "io_setup": 206,
    # Each watch pins the inode it watches; fs.inotify.max_user_watches is the host's.
    "inotify_init": 253,
    "inotify_init1": 294,
    "inotify_add_watch": 254,
}
# Every call that sets, reads, lists or removes an extended attribute, by path, link, file
# descriptor or directory descriptor (the *xattrat calls are Linux 6.13's).
NOT_SUPPORTED: dict[str, int] = {
    "setxattr": 188,
    "lsetxattr": 189,
    "fsetxattr": 190,
    "getxattr": 191,
    "lgetxattr": 192,
    "fgetxattr": 193,
    "listxattr": 194,
    "llistxattr": 195,
    "flistxattr": 196,
    "removexattr": 197,
    "lremovexattr": 198,
    "fremovexattr": 199,
    "setxattrat": 463,
    "getxattrat": 464,
    "listxattrat": 465,
    "removexattrat": 466,
}
SOCKET_CALLS = {"socket": 41, "socketpair": 53}
SOCKET_FAMILIES = {"AF_UNIX": 1}
PERSONALITY = 135
# The query (0xffffffff) and PER_LINUX (0), what every process here already is.
PERSONAS = (0xFFFFFFFF, 0)
FCNTL = 72
F_SETPIPE_SZ = 1031
SETSOCKOPT = 54
SOL_SOCKET = 1
# SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE
SOCKET_BUFFERS = (7, 8, 32, 33)
PRCTL = 157
PR_SET_PDEATHSIG = 1

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]. The
# low half of an argument comes first (x86-64 is little-endian); every argument checked
# here is a 32-bit int or unsigned int to the kernel, so the high half is never read.
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index


def available() -> bool:
    """Whether this filter's numbers are this machine's."""
    return platform.machine() in ("x86_64", "AMD64")


# One instruction: (code, jump if true, jump if false, k); a jump is a label or 0 (the next
# instruction).
_Insn = tuple[int, str | int, str | int, int]


def _assemble(code: list[_Insn | str]) -> bytes:
    """Labels (plain strings in ``code``) resolved into the relative forward jumps BPF has."""
    at: dict[str, int] = {}
    insns: list[_Insn] = []
    for item in code:
        if isinstance(item, str):
            at[item] = len(insns)
        else:
            insns.append(item)
    out = []
    for i, (op, jt, jf, k) in enumerate(insns):
        offsets = []
        for target in (jt, jf):
            offset = at[target] - i - 1 if isinstance(target, str) else target
            if not 0 <= offset <= 255:
                raise ValueError(f"seccomp: jump of {offset} from instruction {i}")
            offsets.append(offset)
        out.append(struct.pack("<HBBI", op, offsets[0], offsets[1], k))
    return b"".join(out)


def program() -> bytes:
    """The filter as ``struct sock_filter`` records (what ``bwrap --seccomp`` reads)."""
    code: list[_Insn | str] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 0, "kill", _AUDIT_ARCH_X86_64),
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE, "kill", 0, _X32_BIT),
    ]
    code += [(_JEQ, "socket", 0, nr) for nr in SOCKET_CALLS.values()]
    code += [(_JEQ, "personality", 0, PERSONALITY), (_JEQ, "fcntl", 0, FCNTL)]
    code += [(_JEQ, "setsockopt", 0, SETSOCKOPT), (_JEQ, "prctl", 0, PRCTL)]
    code += [(_JEQ, "eperm", 0, nr) for nr in sorted(DENIED.values())]
    code += [(_JEQ, "enosys", 0, nr) for nr in sorted(NOT_IMPLEMENTED.values())]
    code += [(_JEQ, "enotsup", 0, nr) for nr in sorted(NOT_SUPPORTED.values())]
    code += [(_RET, 0, 0, _RET_ALLOW), "socket", (_LD_W_ABS, 0, 0, _arg(0))]
    code += [(_JEQ, "allow", 0, family) for family in SOCKET_FAMILIES.values()]
    code += [(_RET, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT), "personality"]
    code += [(_LD_W_ABS, 0, 0, _arg(0))]
    code += [(_JEQ, "allow", 0, persona) for persona in PERSONAS]
    code += [(_RET, 0, 0, _RET_ERRNO | errno.EPERM), "fcntl", (_LD_W_ABS, 0, 0, _arg(1))]
    code += [(_JEQ, "eperm", "allow", F_SETPIPE_SZ), "setsockopt", (_LD_W_ABS, 0, 0, _arg(1))]
    code += [(_JEQ, 0, "allow", SOL_SOCKET), (_LD_W_ABS, 0, 0, _arg(2))]
    code += [(_JEQ, "eperm", 0, option) for option in SOCKET_BUFFERS]
    code += [(_RET, 0, 0, _RET_ALLOW), "prctl", (_LD_W_ABS, 0, 0, _arg(0))]
    code += [
        (_JEQ, "eperm", "allow", PR_SET_PDEATHSIG),
        "allow",
        (_RET, 0, 0, _RET_ALLOW),
        "eperm",
        (_RET, 0, 0, _RET_ERRNO | errno.EPERM),
        "enosys",
        (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
        "enotsup",
        (_RET, 0, 0, _RET_ERRNO | errno.ENOTSUP),
        "kill",
        (_RET, 0, 0, _RET_KILL_PROCESS),
    ]
    return _assemble(code)
