"""``callgate api`` as a real process on a free port, for the API, schema and browser tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from callgate.ops.lab.chaos.services import free_port
from callgate.store import db

DEMO = "callgate.ops.lab.demo.tools:demo_registry"


@dataclass
class ApiServer:
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    # Everything the process wrote to stderr, read as it comes: the API logs a line per
    # request, and an unread pipe would fill and stop the server mid-test.
    lines: list[str]

    def stderr(self) -> str:
        return "".join(self.lines)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_api(env: dict[str, str]) -> ApiServer:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "callgate.ops.cli", "api", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    lines: list[str] = []
    reader = threading.Thread(target=_drain, args=(proc, lines), daemon=True)
    reader.start()
    server = ApiServer(proc, port, env, lines)
    deadline = time.monotonic() + 60  # a loaded machine imports slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            reader.join(5)
            err = server.stderr()
            raise AssertionError(f"callgate api exited {proc.returncode}: {err}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError("callgate api did not answer /healthz within 60 s")


def _drain(proc: subprocess.Popen[bytes], lines: list[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line.decode(errors="replace"))


def make_key(env: dict[str, str], tenant: str, user: str, *roles: str, **extra: Any) -> Any:
    """``callgate keys create --json`` as a user runs it: {"key_id", "key"}."""
    from tests.acceptance.conftest import callgate

    args = ["keys", "create", "--tenant", tenant, "--user", user, "--json"]
    for role in roles:
        args += ["--role", role]
    for name, value in extra.items():
        args += [f"--{name}", str(value)]
    proc = callgate(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    import json

    return json.loads(proc.stdout)


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[Callable[[dict[str, str]], ApiServer]]:
    started: list[ApiServer] = []

    def start(env: dict[str, str]) -> ApiServer:
        server = start_api(env)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def env(make_own_database: Callable[[], str], redis_url: str, queue_name: str) -> dict[str, str]:
    """A database of its own (O-17 is fresh, counts are this test's), the demo tools, and
    refunds from 10,000 up asking for an approval (so the 12,000 KRW refund of O-17 does)."""
    return {
        "CALLGATE_DATABASE_URL": make_own_database(),
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": queue_name,
        "CALLGATE_TOOLS": DEMO,
        "CALLGATE_DEMO_APPROVAL_AMOUNT": "10000",
        "CALLGATE_DEMO_DELAY_MS": "",
        "CALLGATE_SWEEP_SECONDS": "0.5",
    }


@pytest.fixture
def engine(env: dict[str, str]) -> Iterator[Engine]:
    eng = db.create(env["CALLGATE_DATABASE_URL"])
    yield eng
    eng.dispose()


@pytest.fixture
def running(env: dict[str, str], api: Callable[[dict[str, str]], ApiServer]) -> Iterator[ApiServer]:
    from callgate.ops.stack import Stack, wait_for_workers  # imports the worker's modules

    stack = Stack(env=env, workers=1)
    stack.__enter__()
    try:
        wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], 1)
        yield api(env)
    finally:
        stack.stop()
