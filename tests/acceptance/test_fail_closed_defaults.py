"""Unsafe is the default, with real processes.

- A write whose tool declares no effect is treated as irreversible and not idempotent: a
  worker killed in its crash gap is not followed by a second run (counted at the downstream).
- Without CALLGATE_TOOLS, no process loads the demo tools behind the operator's back: worker
  and up refuse to start with one line and exit 2 (submit and tools read the catalogue the
  workers publish: tests/integration/test_tool_catalog.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from callgate.producer import Producer
from tests.acceptance.conftest import SUPPORT_A, requests_for, trace_events, wait_until
from tests.acceptance.test_gate import submit_one


def test_a_write_without_a_declared_effect_is_never_taken_over(producer, stack, engine):
    from tests.acceptance import undeclared_tools

    s = stack(
        workers=1,
        CALLGATE_TOOLS="tests.acceptance.undeclared_tools:registry",
        CALLGATE_DEMO_DELAY_MS="charge_legacy=0:2000",
        CALLGATE_LEASE_SECONDS="1",
        CALLGATE_SWEEP_SECONDS="0.2",
    )
    undeclared = Producer(
        settings=producer.settings,
        engine=producer.engine,
        redis_connection=producer.redis,
        registry=undeclared_tools.registry(),
    )
    turn_id, ref, _, key = submit_one(undeclared, SUPPORT_A, "charge_legacy", {"amount": 500})
    wait_until(lambda: requests_for(engine, key), what="the charge to reach the gateway")
    s.signal("worker-1", signal.SIGKILL)  # in the crash gap: charged, not completed
    s.procs["worker-1"].wait()
    s.start_worker("worker-2")
    (result,) = undeclared.collect(turn_id, timeout=20).results
    assert trace_events(engine, ref, "takeover")
    assert requests_for(engine, key) == 1  # the handler did not run a second time
    assert result.status == "failed_terminal"
    assert result.error.code == "reconciliation_pending"


def _without_tools(service_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CALLGATE_TOOLS", "CALLGATE_ALLOWLIST")}
    env.update({k: v for k, v in service_env.items() if k != "CALLGATE_TOOLS"})
    return env


def _run(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "callgate.ops.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "--burst"],
        ["up", "--workers", "1"],
    ],
    ids=["worker", "up"],
)
def test_no_registry_configured_is_one_clear_line(service_env, tmp_path: Path, command) -> None:
    ctx = tmp_path / "ctx.json"
    ctx.write_text(json.dumps(SUPPORT_A))
    args = [str(ctx) if a == "CTX" else a for a in command]
    proposals = [{"call_id": "c", "tool_name": "get_news", "arguments": {"topic": "x"}}]
    proc = _run(*args, env=_without_tools(service_env), stdin=json.dumps(proposals))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("callgate: invalid_configuration: ")
    assert "CALLGATE_TOOLS" in line and "callgate.ops.lab.demo.tools:demo_registry" in line
