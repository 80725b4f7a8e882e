"""The processes a scenario runs: callgate workers and relayer, bare ``rq worker``s, the
``dramatiq`` CLI.

Every process is a child of the bench, started the way a user starts it (the ``callgate``
CLI, RQ's and dramatiq's own CLIs), and stopped by the bench: SIGTERM, then SIGKILL after a
grace period.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from callgate.ops.stack import wait_for_workers
from callgate.queue import sentinel

BURST_TIMEOUT_SECONDS = 900.0


class BenchError(Exception):
    """A run whose result cannot be trusted: a process failed, a check did not hold."""


LOGS = Path(tempfile.gettempdir())
_serial = itertools.count(1)


@dataclass
class Child:
    """A started process and the file its stderr goes to (read when it fails)."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 5) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        return " | ".join(text)


def callgate(args: list[str], env: Mapping[str, str]) -> Child:
    return _spawn([sys.executable, "-m", "callgate.ops.cli", *args], env)


def rq_worker(
    queue: str,
    redis_url: str,
    env: Mapping[str, str],
    worker_class: str = "callgate.ops.lab.bench.rq_worker.PreloadedWorker",
) -> Child:
    """Bare RQ as its documentation runs it: SimpleWorker (no fork per job; here with the
    bench's jobs imported at start-up, ``callgate.ops.lab.bench.rq_worker``), JSON."""
    return _spawn(
        [
            sys.executable,
            "-m",
            "rq.cli",
            "worker",
            "--burst",
            "--worker-class",
            worker_class,
            "--serializer",
            "rq.serializers.JSONSerializer",
            "--url",
            sentinel.primary_url(redis_url),  # rq's CLI reads no redis+sentinel:// URL
            "--quiet",
            queue,
        ],
        env,
    )


def dramatiq(
    modules: list[str], queue: str, processes: int, threads: int, env: Mapping[str, str]
) -> Child:
    """dramatiq's own CLI: ``processes`` worker processes of ``threads`` threads each, on
    one queue. It has no burst mode: the bench stops it (SIGTERM) once the queue drained."""
    return _spawn(
        [
            sys.executable,
            "-m",
            "dramatiq",
            *modules,
            "--processes",
            str(processes),
            "--threads",
            str(threads),
            "--queues",
            queue,
        ],
        env,
    )


def _spawn(argv: list[str], env: Mapping[str, str]) -> Child:
    log = LOGS / f"bench-{os.getpid()}-{next(_serial)}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            argv,
            # No /metrics unless a scenario asks: many children must never share one port.
            env={**os.environ, "CALLGATE_METRICS_PORT": "0", **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return Child(proc, log)


def wait_all(children: list[Child], what: str) -> None:
    """Wait for burst processes to exit; any failure ends the bench with its stderr."""
    deadline = time.monotonic() + BURST_TIMEOUT_SECONDS
    for child in children:
        try:
            code = child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stop(children)
            raise BenchError(f"{what}: still running after {BURST_TIMEOUT_SECONDS:g}s") from None
        if code != 0:
            stop(children)
            raise BenchError(f"{what} exited {code}: {child.tail()}")


def stop(children: list[Child], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; the logs of clean exits are removed."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def forget(children: list[Child]) -> None:
    for child in children:
        child.log.unlink(missing_ok=True)


def await_workers(redis_url: str, queue: str, count: int) -> None:
    wait_for_workers(redis_url, queue, count, timeout=60.0)


def rss_kib(pid: int) -> int:
    """Resident memory of a process and its descendants, from /proc (KiB)."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except FileNotFoundError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            found += [int(child), *_descendants(int(child))]
    return found
