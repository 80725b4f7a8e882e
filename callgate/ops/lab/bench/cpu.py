"""CPU time of processes from /proc, and which Postgres backends serve which process.

Linux only: it reads ``/proc/<pid>/stat`` (utime, stime and the CPU of reaped children),
``/proc/<pid>/fd`` and ``/proc/<pid>/net/tcp{,6}``. A backend serves a process when the
backend's ``client_port`` (pg_stat_activity) is the local port of one of that process's TCP
sockets to the server's port: the bench runs on the machine of its clients, so the pair
(local port, server port) names one connection.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, reaped: bool = True) -> float | None:
    """utime + stime of ``pid`` (and, with ``reaped``, of its children it has waited for);
    None once the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may hold spaces and parentheses: fields count from the last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    ticks = utime + stime + (cutime + cstime if reaped else 0)
    return ticks / TICKS_PER_SECOND


def children(pid: int) -> list[int]:
    """Live children of ``pid`` (every thread's), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    out = [pid]
    for child in children(pid):
        out += tree(child)
    return out


def tree_cpu_seconds(pid: int) -> float:
    """A process tree's CPU: the root's (with the children it reaped) and every live
    descendant's. Postgres' postmaster reaps each backend that exits, so this is the whole
    server's CPU since it started."""
    total = 0.0
    for p in tree(pid):
        found = cpu_seconds(p)
        total += found or 0.0
    return total


def local_ports(pids: list[int], server_port: int) -> dict[int, int]:
    """local TCP port → pid, for the sockets of ``pids`` connected to ``server_port``."""
    inode_pid: dict[str, int] = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except (FileNotFoundError, PermissionError):
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode_pid[target[8:-1]] = pid
    ports: dict[int, int] = {}
    if not inode_pid:
        return ports
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pids[0]}/net/{table}").read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            cols = line.split()
            local, remote, inode = cols[1], cols[2], cols[9]
            if inode in inode_pid and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports[int(local.rsplit(":", 1)[1], 16)] = inode_pid[inode]
    return ports
