"""run_python's pure parts (which limit a run met, the seccomp program run through a BPF
interpreter, the bwrap command line read back as mounts, the memory one slot can hold,
images in safe results) and its refusal to register where the sandbox cannot be built."""

from __future__ import annotations

import base64
import errno
import io
import shutil
import signal
import socket
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from PIL import Image

from callgate.core.errors import ConfigurationError, ErrorCode
from callgate.tools import results
from callgate.tools.registry import (
    READ_ONLY,
    ResultLimits,
    Tool,
)
from callgate.worker.sandbox import Limits, command, python_tool, runner, seccomp
from callgate.worker.sandbox import limits as sandbox_limits
from callgate.worker.sandbox import tool as sandbox_tool
from callgate.worker.sandbox.limits import Observed, limit_met

LIMITS = Limits(wall_seconds=2, cpu_seconds=1)
MiB, GiB = 1 << 20, 1 << 30


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


# The seccomp filter, run here as the kernel runs it: a classic BPF program over
# ``struct seccomp_data`` (nr, arch, instruction pointer, six arguments).
ALLOW, KILL = 0x7FFF0000, 0x80000000
X86_64 = 0xC000003E
# From the kernel's arch/x86/entry/syscalls/syscall_64.tbl, written out again here so a
# wrong number in seccomp.py fails this test rather than letting the call through.
SYSCALLS = {
    "read": 0, "write": 1, "mmap": 9, "clone": 56, "execve": 59, "wait4": 61, "fcntl": 72,
    "futex": 202, "openat": 257, "getrandom": 318, "rseq": 334,
    "socket": 41, "socketpair": 53, "personality": 135,
    "ptrace": 101, "modify_ldt": 154, "kcmp": 312, "move_pages": 279, "mbind": 237,
    "set_mempolicy": 238, "get_mempolicy": 239, "migrate_pages": 256,
    "set_mempolicy_home_node": 450, "process_madvise": 440, "process_mrelease": 448,
    "landlock_create_ruleset": 444, "landlock_add_rule": 445, "landlock_restrict_self": 446,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "open_tree": 428, "open_tree_attr": 467, "clock_adjtime": 305, "quotactl_fd": 443,
    "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153, "lsm_set_self_attr": 460,
    "clone3": 435, "pidfd_open": 434, "pidfd_getfd": 438, "memfd_create": 319,
    "memfd_secret": 447, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
    "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69,
    "msgrcv": 70, "msgctl": 71, "mq_open": 240, "io_setup": 206,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "getxattr": 191, "lgetxattr": 192,
    "fgetxattr": 193, "listxattr": 194, "llistxattr": 195, "flistxattr": 196,
    "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199, "setxattrat": 463,
    "getxattrat": 464, "listxattrat": 465, "removexattrat": 466, "inotify_init": 253,
    "inotify_init1": 294, "inotify_add_watch": 254, "timer_create": 222, "setsockopt": 54,
    "prctl": 157,
}  # fmt: skip
# What issue 35 asked to deny (and what was found with it), and the error each gets.
NEWLY_DENIED = {
    **dict.fromkeys(
        [
            "modify_ldt", "kcmp", "move_pages", "mbind", "set_mempolicy", "get_mempolicy",
            "migrate_pages", "set_mempolicy_home_node", "process_madvise", "process_mrelease",
            "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
            "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree",
            "open_tree_attr", "clock_adjtime", "quotactl_fd", "uselib", "ustat", "sysfs",
            "vhangup", "lsm_set_self_attr",
        ],
        errno.EPERM,
    ),
    # Memory held outside the address-space limit and the sized mounts, or a feature a
    # library probes for and does without: "not implemented", as on a kernel without it.
    **dict.fromkeys(
        [
            "pidfd_open", "pidfd_getfd", "memfd_create", "memfd_secret", "shmget", "shmat",
            "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
            "msgrcv", "msgctl", "mq_open", "io_setup",
        ],
        errno.ENOSYS,
    ),
}  # fmt: skip


def _bpf(program: bytes, nr: int, args: tuple[int, ...] = (), arch: int = X86_64) -> int:
    """The action the filter returns for one system call."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    assert 0 < len(insns) <= 4096 and len(program) % 8 == 0
    acc, pc = 0, 0
    while True:
        assert pc < len(insns), "ran off the end of the program"
        code, jt, jf, k = insns[pc]
        pc += 1  # jumps are relative to the next instruction, so only forward
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            assert k % 4 == 0 and k + 4 <= len(data)
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += jt if acc == k else jf
        elif code == 0x35:  # BPF_JMP | BPF_JGE | BPF_K
            pc += jt if acc >= k else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return int(k)
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def _err(number: int) -> int:
    return 0x00050000 | number


def test_the_filter_lets_ordinary_calls_through_and_kills_other_abis() -> None:
    program = seccomp.program()
    for name in ("read", "write", "mmap", "clone", "execve", "wait4", "futex", "openat"):
        assert _bpf(program, SYSCALLS[name]) == ALLOW, name
    assert _bpf(program, SYSCALLS["getrandom"]) == ALLOW
    assert _bpf(program, SYSCALLS["rseq"]) == ALLOW
    assert _bpf(program, SYSCALLS["read"] | 0x40000000) == KILL  # x32
    assert _bpf(program, SYSCALLS["read"], arch=0x40000003) == KILL  # i386
    assert _bpf(program, SYSCALLS["ptrace"]) == _err(errno.EPERM)
    assert _bpf(program, SYSCALLS["clone3"]) == _err(errno.ENOSYS)


def test_the_filter_denies_each_call_named_in_the_issue_with_its_errno() -> None:
    program = seccomp.program()
    got = {name: _bpf(program, SYSCALLS[name]) for name in NEWLY_DENIED}
    assert got == {name: _err(number) for name, number in NEWLY_DENIED.items()}


XATTR_CALLS = [name for name in SYSCALLS if "xattr" in name]


def test_the_filter_refuses_every_extended_attribute_call_as_unsupported() -> None:
    """Issue 46: a user xattr on tmpfs is charged to inode space, not to the mount's size."""
    program = seccomp.program()
    assert len(XATTR_CALLS) == 16
    got = {name: _bpf(program, SYSCALLS[name]) for name in XATTR_CALLS}
    assert got == dict.fromkeys(XATTR_CALLS, _err(errno.ENOTSUP))


def test_the_filter_refuses_inotify_and_leaves_timers_to_their_rlimit() -> None:
    program = seccomp.program()
    for name in ("inotify_init", "inotify_init1", "inotify_add_watch"):
        assert _bpf(program, SYSCALLS[name]) == _err(errno.ENOSYS), name
    assert _bpf(program, SYSCALLS["timer_create"]) == ALLOW  # RLIMIT_SIGPENDING caps them


def test_the_filter_keeps_socket_buffers_and_the_parent_death_signal() -> None:
    program = seccomp.program()
    nr, sol_socket = SYSCALLS["setsockopt"], 1
    for option in (7, 8, 32, 33):  # SO_SNDBUF, SO_RCVBUF, and their FORCE forms
        assert _bpf(program, nr, (3, sol_socket, option)) == _err(errno.EPERM), option
    assert _bpf(program, nr, (3, sol_socket, 2)) == ALLOW  # SO_REUSEADDR
    assert _bpf(program, nr, (3, 6, 7)) == ALLOW  # IPPROTO_TCP's option 7 is another
    prctl = SYSCALLS["prctl"]
    assert _bpf(program, prctl, (1, 0)) == _err(errno.EPERM)  # PR_SET_PDEATHSIG
    assert _bpf(program, prctl, (2, 0)) == ALLOW  # PR_GET_PDEATHSIG
    assert _bpf(program, prctl, (15, 0)) == ALLOW  # PR_SET_NAME


def test_the_filter_makes_only_unix_sockets() -> None:
    program = seccomp.program()
    for call in ("socket", "socketpair"):
        for family in range(64):
            want = ALLOW if family == socket.AF_UNIX else _err(errno.EAFNOSUPPORT)
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):
                assert _bpf(program, SYSCALLS[call], (family, kind, 0)) == want, (call, family)
        # The kernel reads the family as a 32-bit int: the high half changes nothing.
        vsock = (7 << 32) | socket.AF_VSOCK
        assert _bpf(program, SYSCALLS[call], (vsock, 1, 0)) == _err(errno.EAFNOSUPPORT)
        assert _bpf(program, SYSCALLS[call], ((7 << 32) | socket.AF_UNIX, 1, 0)) == ALLOW


def test_the_filter_answers_personality_queries_and_refuses_changes() -> None:
    program = seccomp.program()
    nr = SYSCALLS["personality"]
    assert _bpf(program, nr, (0xFFFFFFFF,)) == ALLOW  # the query some C libraries make
    assert _bpf(program, nr, (0,)) == ALLOW  # PER_LINUX, what it already is
    assert _bpf(program, nr, (1 << 32,)) == ALLOW  # still PER_LINUX: an unsigned int
    # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ADDR_COMPAT_LAYOUT, PER_LINUX32
    for persona in (0x0040000, 0x0400000, 0x0200000, 0x0008):
        assert _bpf(program, nr, (persona,)) == _err(errno.EPERM), hex(persona)


def test_the_filter_keeps_pipes_at_their_default_size() -> None:
    program = seccomp.program()
    f_setpipe_sz, f_getpipe_sz, f_getfl = 1031, 1032, 3
    assert _bpf(program, SYSCALLS["fcntl"], (3, f_setpipe_sz, 1 << 20)) == _err(errno.EPERM)
    assert _bpf(program, SYSCALLS["fcntl"], (3, f_getpipe_sz)) == ALLOW
    assert _bpf(program, SYSCALLS["fcntl"], (3, f_getfl)) == ALLOW


# The bwrap command line, read back as the operations bwrap performs, in order.
_ARITY = {
    "--unshare-all": 0, "--unshare-user": 0, "--disable-userns": 0, "--die-with-parent": 0,
    "--as-pid-1": 0, "--new-session": 0, "--clearenv": 0, "--hostname": 1, "--proc": 1,
    "--dev": 1, "--tmpfs": 1, "--size": 1, "--remount-ro": 1, "--dir": 1, "--chdir": 1,
    "--seccomp": 1, "--perms": 1, "--ro-bind": 2, "--bind": 2, "--dev-bind": 2,
    "--symlink": 2, "--ro-bind-data": 2, "--setenv": 2,
}  # fmt: skip


def _bwrap_ops(args: list[str]) -> list[tuple[str, ...]]:
    """``(option, operands...)`` in order; a ``--size`` is folded into the ``--tmpfs`` it
    sizes, as a last item (``""`` for a tmpfs without one)."""
    rest = args[args.index("--") + 1 :]  # past prlimit's options
    assert Path(rest[0]).name == "bwrap"
    rest = rest[1 : rest.index("--")]
    ops: list[tuple[str, ...]] = []
    size = ""
    while rest:
        option = rest.pop(0)
        assert option in _ARITY, f"unknown bwrap option {option}"
        operands = tuple(rest[: _ARITY[option]])
        del rest[: _ARITY[option]]
        if option == "--size":
            size = operands[0]
            continue
        if option == "--tmpfs":
            operands, size = (*operands, size), ""
        ops.append((option, *operands))
    return ops


def _argv(limits: Limits | None = None, hidden: tuple[str, ...] = ()) -> list[str]:
    view = command.View(interpreter=Path("/usr/bin/python3"), hidden_proc=hidden)
    fds = command.Fds(snippet=10, report=11, lifeline=14, inputs={"a.csv": 12}, seccomp=13)
    return command.argv(view, limits or Limits(), fds, {}, bwrap="bwrap", prlimit="prlimit")


def test_dev_is_read_only_and_holds_only_the_devices_python_needs() -> None:
    ops = _bwrap_ops(_argv())
    # bwrap's own --dev is a writable tmpfs as large as half the host's memory, with a pty
    # multiplexer in it: built by hand instead.
    assert [op for op in ops if op[0] == "--dev"] == []
    made = ops.index(("--tmpfs", "/dev", str(command.DEV_BYTES)))
    assert ops.index(("--remount-ro", "/dev")) > made
    devices = sorted(op[1:] for op in ops if op[0] == "--dev-bind")
    names = ("full", "null", "random", "urandom", "zero")
    assert devices == [(f"/dev/{name}", f"/dev/{name}") for name in names]
    targets = {op[1] if op[0] == "--tmpfs" else op[-1] for op in ops if len(op) > 1}
    assert not targets & {"/dev/ptmx", "/dev/pts", "/dev/tty", "/dev/console"}


def test_every_writable_mount_is_sized_and_the_sizes_are_the_scratch_and_output_budget() -> None:
    limits = Limits(scratch_bytes=48 * MiB, shm_bytes=2 * MiB, output_file_bytes=3 * MiB)
    ops = _bwrap_ops(_argv(limits))
    tmpfs = {op[1]: op[2] for op in ops if op[0] == "--tmpfs"}
    assert all(size.isdigit() for size in tmpfs.values()), tmpfs
    read_only = {op[1] for op in ops if op[0] == "--remount-ro"}
    writable = {path: int(size) for path, size in tmpfs.items() if path not in read_only}
    assert writable == {"/tmp": 46 * MiB, "/dev/shm": 2 * MiB, "/output": 3 * MiB}
    assert [op for op in ops if op[0] == "--bind"] == []  # nothing of the host is writable
    assert read_only >= {"/", "/dev"}
    bound = sandbox_limits.slot_memory(limits)
    assert sum(writable.values()) == bound["scratch"] + bound["output"]


def test_shm_is_carved_out_of_the_scratch_budget() -> None:
    with pytest.raises(ConfigurationError, match="shm_bytes"):
        Limits(scratch_bytes=4 * MiB, shm_bytes=4 * MiB)


def test_what_one_slot_can_hold_is_bounded_and_documented() -> None:
    terms = sandbox_limits.slot_memory(Limits())
    total = sum(terms.values())
    # Each process's address space and its kernel bookkeeping, the tmpfs mounts and their
    # inodes, the inputs copied in, the kernel buffers behind every descriptor, queued
    # signals and timers, inotify (none: seccomp), and what the worker buffers.
    assert set(terms) == {
        "address_space", "kernel_per_process", "scratch", "output", "inodes", "inputs",
        "descriptors", "signals", "inotify", "worker",
    }  # fmt: skip
    assert terms["address_space"] == 8 * 256 * MiB  # issue 46: was 32 × 512 MiB
    assert terms["scratch"] == 64 * MiB and terms["output"] == 4 * MiB
    assert terms["inotify"] == 0
    assert total <= 3 * GiB
    docs = (Path(__file__).resolve().parents[2] / "docs" / "tools.md").read_text()
    assert f"{total / GiB:.2f} GiB" in docs
    # The settings it names move it.
    small = Limits(memory_bytes=128 * MiB, max_processes=4, max_open_files=32)
    assert sum(sandbox_limits.slot_memory(small).values()) < 1 * GiB


def test_the_slot_figure_follows_the_hosts_settings() -> None:
    """A host whose wmem_max is 4 MiB let 60 Unix sockets pin 245 MiB (issue 46): the filter
    keeps buffers at wmem_default, and without it the figure counts wmem_max and inotify."""
    host = sandbox_limits.Host(wmem_max=4 * MiB, inotify_watches=192_540, tmpfs_inodes=3 << 20)
    limits = Limits()
    filtered = sandbox_limits.slot_memory(limits, host)
    bare = sandbox_limits.slot_memory(limits, host, seccomp=False)
    assert filtered["descriptors"] == 9 * 64 * 3 * 212_992
    assert bare["descriptors"] == 9 * 64 * 3 * 4 * MiB
    assert bare["inotify"] == 192_540 * sandbox_limits.WATCH_BYTES
    # A worker that is not root cannot cap its mounts' inodes: each holds the host's default.
    unbounded = sandbox_limits.slot_memory(limits, host, inodes_bounded=False)
    assert unbounded["inodes"] == 3 * (3 << 20) * sandbox_limits.INODE_BYTES
    assert filtered["inodes"] < 64 * MiB


def test_each_writable_mount_has_an_inode_cap() -> None:
    limits = Limits(scratch_inodes=5_000)
    ops = _bwrap_ops(_argv(limits))
    read_only = {op[1] for op in ops if op[0] == "--remount-ro"}
    writable = {op[1] for op in ops if op[0] == "--tmpfs"} - read_only
    caps = command.inodes(limits)
    assert set(caps) == writable
    assert caps["/tmp"] == 5_000


def test_queued_signals_and_timers_are_capped() -> None:
    assert f"--sigpending={sandbox_limits.PENDING_SIGNALS}" in _argv()


def test_host_revealing_proc_files_are_covered_after_proc_is_mounted() -> None:
    assert {"kallsyms", "config.gz"} <= set(command.HIDDEN_PROC)
    ops = _bwrap_ops(_argv(hidden=("config.gz", "kallsyms")))
    proc = ops.index(("--proc", "/proc"))
    covers = [(i, op) for i, op in enumerate(ops) if op[-1].startswith("/proc/")]
    assert [op for _, op in covers] == [
        ("--ro-bind", "/dev/null", "/proc/config.gz"),
        ("--ro-bind", "/dev/null", "/proc/kallsyms"),
    ]
    assert all(i > proc for i, _ in covers)


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def _ihdr(width: int, height: int) -> bytes:
    return _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))


def _png(width: int = 32, height: int = 16) -> bytes:
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _ihdr(width, height)
        + _chunk(b"IDAT", zlib.compress(rows))
        + _chunk(b"IEND", b"")
    )


def _pillow(kind: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB" if kind == "JPEG" else "P", (10, 7)).save(out, kind)
    return out.getvalue()


PNG = _png()
HTML = b"<html><body><script>alert(document.cookie)</script></body></html>"
FAKE_PNG = b"\x89PNG\r\n\x1a\n" + HTML


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


def _shown(tool: Tool, mime: str, data: bytes | str) -> tuple[str | None, list[str]]:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    image = {"name": "p", "mime_type": mime, "data_base64": encoded}
    payload, notes = results.safe_result(tool, {"files": [image]})
    shown: str | None = payload["content"]["files"][0]["data_base64"]
    return shown, notes


def test_an_image_passes_whole_only_when_a_decoder_reads_it_as_what_it_says() -> None:
    real = (("image/png", PNG), ("image/jpeg", _pillow("JPEG")), ("image/gif", _pillow("GIF")))
    for mime, data in real:
        shown, notes = _shown(_image_tool(1024), mime, data)
        assert shown == base64.b64encode(data).decode() and notes == [], mime
    # A header claiming 10^10 pixels, the rest a small image's.
    huge = PNG[:8] + _ihdr(100_000, 100_000) + PNG[33:]
    # Not allowed by the tool, too large, or not what it says it is: withheld.
    withheld: tuple[tuple[Tool, str, bytes | str], ...] = (
        (_image_tool(0), "image/png", PNG),
        (_image_tool(16), "image/png", PNG),
        (_image_tool(1024), "image/jpeg", PNG),
        (_image_tool(1024), "text/plain", PNG),
        (_image_tool(1024), "image/png", FAKE_PNG),  # the signature, then HTML
        (_image_tool(1024), "image/png", PNG[:33] + HTML),  # a whole header, then HTML
        (_image_tool(1024), "image/jpeg", b"\xff\xd8\xff" + HTML),
        (_image_tool(1024), "image/gif", b"GIF89a" + HTML),
        (_image_tool(1024), "image/png", huge),
        (_image_tool(1024), "image/png", "sk-" + "a" * 40),
    )
    for tool, mime, sent in withheld:
        shown, notes = _shown(tool, mime, sent)
        assert shown is None and "image_withheld" in notes, (mime, sent[:40])


def test_a_file_named_as_an_image_that_is_not_one_comes_back_as_a_file() -> None:
    svg = b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>"
    done = runner.Run(
        seen=Observed(exit_code=0),
        files=[
            ("page.png", FAKE_PNG),
            ("page.svg", svg),
            ("plot.png", PNG),
            ("photo.dat", _pillow("JPEG")),
        ],
    )
    files = {f["name"]: f for f in sandbox_tool._result(done)["files"]}
    assert files["page.png"]["mime_type"] == "application/octet-stream"
    assert "data_base64" not in files["page.png"] and files["page.png"]["size"] == len(FAKE_PNG)
    assert files["page.svg"]["mime_type"] == "application/octet-stream"
    assert files["page.svg"]["text"] == svg.decode()
    assert files["plot.png"]["mime_type"] == "image/png"
    assert base64.b64decode(files["plot.png"]["data_base64"]) == PNG
    # What it is, not what it is called.
    assert files["photo.dat"]["mime_type"] == "image/jpeg"


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
