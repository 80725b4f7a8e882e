"""Starts callgate's long-running parts as real processes and stops them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType


@dataclass
class Stack:
    """Workers, relayer and sweeper as child processes of this one.

    ``env`` is passed to every child on top of this process's environment (database and
    Redis URLs, lease length, demo delays…). With ``log_path``, every child's stderr (its
    logs) is appended to that file instead of this process's stderr.
    """

    env: Mapping[str, str]
    workers: int = 2
    relayer: bool = True
    sweeper: bool = True
    log_path: str | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __enter__(self) -> Stack:
        for i in range(self.workers):
            self.start_worker(f"worker-{i + 1}")
        if self.relayer:
            self.start("relayer", ["relayer"])
        if self.sweeper:
            self.start("sweeper", ["sweeper"])
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        return self.start(name, ["worker", "--name", f"{name}-{os.getpid()}-{time.monotonic_ns()}"])

    def start(
        self, name: str, args: list[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "callgate.ops.cli", *args],
                env={**os.environ, **self.env, **(env or {})},
                stdin=subprocess.DEVNULL,
                stderr=log,
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        self.procs[name] = proc
        return proc

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.procs[name].send_signal(sig)

    def stop(self, timeout: float = 5.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def alive(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is None]


def wait_for_workers(redis_url: str, queue: str, count: int, timeout: float = 30.0) -> None:
    """Block until ``count`` RQ workers listen on ``queue`` (they register on start)."""
    from rq import Worker

    from callgate.store import transport

    connection = transport.connect(redis_url)
    q = transport.job_queue(connection, queue)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(Worker.all(queue=q)) >= count:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{count} worker(s) did not start on queue {queue!r} in {timeout}s")
