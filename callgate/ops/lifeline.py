"""A process started by a ``Stack`` ends with the process that started it.

Without this, a parent killed by SIGKILL (an eval run, a demo, ``callgate up``) leaves its
workers, relayer and sweeper running under init, holding its scratch database and queue.
The parent names itself in ``CALLGATE_PARENT_PID``; the child asks the kernel for SIGTERM
when its parent goes (Linux's ``PR_SET_PDEATHSIG``), then checks that the parent is still
the one named, since it may have gone before the request was made. SIGTERM is the graceful
stop every callgate process already handles.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PARENT_ENV = "CALLGATE_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def child_env() -> dict[str, str]:
    return {PARENT_ENV: str(os.getpid())}


def die_with_parent() -> bool:
    """Arrange SIGTERM on the parent's death when a parent asked for it; whether it did.
    The variable is removed, so this process's own children are not bound to its parent."""
    named = os.environ.pop(PARENT_ENV, "")
    if not named.isdigit() or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return False
    if os.getppid() != int(named):
        os.kill(os.getpid(), signal.SIGTERM)  # the parent was gone already
    return True


class Stopped(SystemExit):
    """SIGTERM or SIGHUP, raised where the main thread was, so cleanup runs on the way out."""


@contextmanager
def unwind_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``Stopped`` (exit status 128 + the signal): the
    ``with`` blocks above unwind, stopping a stack's children and removing scratch data, as
    they do on Ctrl-C. Outside the main thread, signals cannot be handled: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
