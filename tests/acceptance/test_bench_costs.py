"""``callgate bench costs`` as a user runs it: real workers, relayer, Postgres and Redis.

Asserts that every cost was measured and is plausible (positive, within what one call on
one machine can cost), never on how fast: the figures are for the docs, not judged here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.services

CALLS = 2000


@pytest.mark.timeout(240)
def test_costs_are_measured_per_call_for_reads_and_writes(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "costs.json"
    env = {**os.environ, "CALLGATE_DATABASE_URL": database_url, "CALLGATE_REDIS_URL": redis_url}
    # Enough calls that the reads, which run at a few thousand a second on a quiet machine,
    # still span the bench's minimum window of samples.
    argv = [sys.executable, "-m", "callgate", "bench", "costs", "--calls", str(CALLS)]
    done = subprocess.run(
        [*argv, "--out", str(out)], env=env, capture_output=True, text=True, timeout=230
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {out}" in done.stdout

    found = json.loads(out.read_text())
    assert found["command"].startswith(f"callgate bench costs --calls {CALLS}")
    assert found["machine"]["cores"] == os.cpu_count()
    assert found["machine"]["pg_max_connections"] > 0
    assert set(found["kinds"]) == {"reads", "writes"}
    for name, k in found["kinds"].items():
        assert k["calls"] == CALLS and k["workers"] == 2, name
        # CPU per call, in ms: above zero, below what would mean a broken measurement.
        for cost in (
            "pg_cpu_ms_per_call",
            "worker_cpu_ms_per_call",
            "relayer_cpu_ms_per_call",
            "redis_cpu_ms_per_call",
        ):
            assert 0 < k[cost] < 200, (name, cost, k[cost])
        assert k["pg_cpu_ms_per_call"] == pytest.approx(
            sum(k["pg_cpu_ms_per_call_by_stage"].values()), abs=0.01
        )
        # Redis: every call is enqueued, reserved and published through it.
        assert k["redis_commands_per_call"] > 0
        assert 0 < k["counted_in_process"]["redis_commands_per_call"] < 100
        assert 0 < k["counted_in_process"]["pg_round_trips_per_call"] < 100
        # Each worker holds at least its pool's connection, and no more than K + its
        # sweeper's and the demo tools' pools could open.
        assert 1 <= k["pg_connections_per_worker"] <= k["concurrency"] * 3
        assert k["pg_connections_per_relayer"] >= 1
        # The windows are steady state: after the warm-up, with calls inside them.
        window = k["window"]
        assert 0 < window["worker_calls"] <= CALLS and window["worker_seconds"] > 0
    # Writes touch the demo's payments through the worker's downstream connection.
    assert found["kinds"]["writes"]["downstream_pg_cpu_ms_per_call"] > 0
    assert (
        "callgate-downstream"
        in found["kinds"]["writes"]["pg_connections_per_worker_by_application"]
    )

    model = subprocess.run(
        [
            *[sys.executable, "-m", "callgate", "bench", "model", "--costs", str(out)],
            *["--workers", "4", "--concurrency", "32", "--pg-cores", "2"],
            *["--mix", "reads=0.8,writes=0.2", "--handler-ms", "100"],
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert model.returncode == 0, model.stderr
    assert "saturates first: " in model.stdout
