"""Starts callgate's long-running parts as real processes and stops them."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from rq import Worker

from callgate.core.errors import CallgateError, ConfigurationError, ErrorCode
from callgate.ops import lifeline
from callgate.queue import transport


@dataclass
class Stack:
    """Workers, relayer and sweeper as child processes of this one, which end with it
    (``lifeline``: SIGTERM when this process dies, even by SIGKILL).

    ``env`` is passed to every child on top of this process's environment (database and
    Redis URLs, lease length, demo delays…). With ``log_path``, every child's stderr (its
    logs) is appended to that file instead of this process's stderr.

    With ``metrics_port`` P, every child serves /metrics on a port of its own: the sweeper
    on P, the relayer on P+1, ``worker-i`` on P+1+i, any other child on the next free one
    after those. Without it, children serve none (CALLGATE_METRICS_PORT=0), even if this
    process's environment sets a port: two children can never share one.
    """

    env: Mapping[str, str]
    workers: int = 2
    relayer: bool = True
    sweeper: bool = True
    log_path: str | None = None
    metrics_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

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
        port = self.port_of(name) if self.metrics_port else 0
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "callgate.ops.cli", *args],
                env={
                    **os.environ,
                    **self.env,
                    "CALLGATE_METRICS_PORT": str(port),
                    **lifeline.child_env(),
                    **(env or {}),
                },
                stdin=subprocess.DEVNULL,
                stderr=log,
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor
        self.procs[name] = proc
        return proc

    def metrics_ports(self) -> dict[str, int]:
        """The port each child of ``__enter__`` serves /metrics on (empty without a base)."""
        if not self.metrics_port:
            return {}
        names = [f"worker-{i + 1}" for i in range(self.workers)]
        names += ["relayer"] * self.relayer + ["sweeper"] * self.sweeper
        return {name: self.port_of(name) for name in names}

    def port_of(self, name: str) -> int:
        """``name``'s metrics port, the same on every restart of that child."""
        if name not in self.ports:
            base = self.metrics_port
            wanted = {"sweeper": base, "relayer": base + 1}.get(name)
            match = re.fullmatch(r"worker-(\d+)", name)
            if match:
                wanted = base + 1 + int(match.group(1))
            taken = set(self.ports.values())
            if wanted is None or wanted in taken:
                wanted = max(taken | {base + 1 + self.workers}) + 1
            self.ports[name] = wanted
        return self.ports[name]

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


def check_ports_free(ports: Mapping[str, int], host: str = "0.0.0.0") -> None:
    """Refuse, with the first taken port, before any child starts."""
    for name, port in ports.items():
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError as exc:
                raise ConfigurationError(
                    f"metrics port {host}:{port} for the {name} cannot be bound "
                    f"({exc.strerror}); pick another base with --metrics-port or "
                    "CALLGATE_METRICS_PORT"
                ) from None


def wait_for_workers(
    redis_url: str,
    queue: str,
    count: int,
    timeout: float = 30.0,
    *,
    stack: Stack | None = None,
    hint: str = "",
) -> None:
    """Block until ``count`` RQ workers listen on ``queue`` (they register on start).

    With ``stack``, a worker of it that exits first ends the wait at once (a registry that
    cannot be imported, say) rather than after ``timeout``. Either way the error is one
    ``embedded_service_failed`` line, ending with the caller's ``hint`` (which setting
    raises the timeout, where the logs are).
    """
    connection = transport.connect(redis_url)
    q = transport.job_queue(connection, queue)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(Worker.all(queue=q)) >= count:
            return
        exited = {
            name: proc.returncode
            for name, proc in (stack.procs.items() if stack is not None else ())
            if name.startswith("worker-") and proc.poll() is not None
        }
        if exited:
            said = ", ".join(f"{name} with status {code}" for name, code in exited.items())
            raise CallgateError(
                f"workers exited before they started ({said}){hint}",
                code=ErrorCode.EMBEDDED_SERVICE_FAILED,
            )
        time.sleep(0.05)
    raise CallgateError(
        f"{count} worker(s) did not start on queue {queue!r} in {timeout:g} s{hint}",
        code=ErrorCode.EMBEDDED_SERVICE_FAILED,
    )
