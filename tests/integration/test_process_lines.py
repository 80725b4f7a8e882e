"""Each process says what it serves when it starts and why it stops, at the default level."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest


def _start_line(proc: subprocess.Popen[str], what: str) -> dict[str, object]:
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        doc = json.loads(line)
        if doc["logger"] == f"callgate.process.{what}":
            return doc  # type: ignore[no-any-return]
    raise AssertionError(f"no start line from the {what}")


@pytest.mark.parametrize("what", ["worker", "relayer", "sweeper"])
def test_one_start_line_and_one_stop_line(
    what: str, make_own_database: Callable[[], str], service_env: dict[str, str]
) -> None:
    env = {**os.environ, **service_env, "CALLGATE_DATABASE_URL": make_own_database()}
    env.pop("CALLGATE_LOG_LEVEL", None)  # the default level
    args = [what, "--concurrency", "3"] if what == "worker" else [what]
    proc = subprocess.Popen(
        [sys.executable, "-m", "callgate", "--log-format", "json", *args],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        start = _start_line(proc, what)
        message = str(start["message"])
        assert start["level"] == "info" and "started" in message
        assert service_env["CALLGATE_QUEUE"] in message
        assert "@" not in message.split("postgres", 1)[1]  # no user or password
        if what == "worker":
            assert "concurrency 3" in message and "refund_payment@1" in message
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    stops = [
        json.loads(line)
        for line in rest.splitlines()
        if line.startswith("{") and json.loads(line)["logger"] == f"callgate.process.{what}"
    ]
    assert len(stops) == 1, rest
    assert f"{what} " in stops[0]["message"] and "stopped on" in stops[0]["message"]
    assert ("on SIGTERM" if what == "worker" else "on a signal") in stops[0]["message"]
