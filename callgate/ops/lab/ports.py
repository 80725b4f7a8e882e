"""Free TCP ports on 127.0.0.1 for the servers a lab command or a test starts itself."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from callgate.core.errors import CallgateError, ErrorCode


def free_port_block(size: int) -> int:
    """The first of ``size`` consecutive ports that are free now, below the kernel's
    ephemeral range: a process binds its port seconds after this check, and meanwhile any
    outgoing connection on the machine (a database client, another test) could be given a
    port from the ephemeral range, and the bind would fail."""
    top = _ephemeral_low() - size - 1
    for _ in range(500):
        base = random.randint(10000, top)
        if all(_free(base + i) for i in range(size)):
            return base
    raise CallgateError(
        f"no block of {size} free ports below {top}", code=ErrorCode.EMBEDDED_SERVICE_FAILED
    )


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
