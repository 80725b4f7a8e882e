"""``callgate bench --quick`` as a user runs it: a subprocess into a temporary folder.

Asserts on counts and on the checks inside the bench (every call ended, one side effect per
redelivered write), never on speed: the figures are printed, not judged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.services


@pytest.mark.timeout(600)
def test_quick_bench_writes_its_results_and_its_checks_hold(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    env = {
        **os.environ,
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_REDIS_URL": redis_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "callgate.ops.cli", "bench", "--quick", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert done.returncode == 0, done.stderr[-2000:]

    result = json.loads((out / "bench.json").read_text())
    table = (out / "bench.md").read_text()
    for png in ("throughput.png", "latency.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    cfg = result["config"]
    assert cfg["quick"] and cfg["workers"] == [1, 2] and cfg["repeat"] == 1
    for scenario in ("noop", "write", "io"):
        rows = result["throughput"][scenario]["rows"]
        assert [r["workers"] for r in rows] == [1, 2]
        for row in rows:
            assert len(row["callgate_runs"]) == len(row["baseline_runs"]) == 1
            assert row["callgate_per_s"] > 0 and row["baseline_per_s"] > 0
    assert "| No-op reads (get_stock) | 2 |" in table

    # Every baseline ran beside callgate with the same W; the threads are callgate's K
    # (bare RQ runs one job at a time), and callgate is read against the threaded ceiling.
    systems = {
        "noop": {"bare_rq": 1, "rq_durable": 1, "dramatiq": 8, "dramatiq_durable": 8},
        "write": {"bare_rq": 1, "rq_durable_refund": 1, "dramatiq_durable_refund": 8},
        "io": {"bare_rq": 1, "dramatiq": cfg["concurrency"]},
    }
    for scenario, threads in systems.items():
        for row in result["throughput"][scenario]["rows"]:
            got = {name: b["threads"] for name, b in row["baselines"].items()}
            assert got == threads
            for b in row["baselines"].values():
                assert b["workers"] == row["workers"] and len(b["runs"]) == 1 and b["per_s"] > 0
            assert row["ratio_to_threaded_ceiling"] > 0
    noop = result["throughput"]["noop"]["rows"][0]
    assert noop["threaded_ceiling"] == "dramatiq_durable"
    assert noop["threaded_ceiling_per_s"] == noop["baselines"]["dramatiq_durable"]["per_s"]
    write = result["throughput"]["write"]["rows"][0]
    assert write["threaded_ceiling"] == "dramatiq_durable_refund"
    assert write["threaded_ceiling_per_s"] == write["baselines"]["dramatiq_durable_refund"]["per_s"]
    assert "Writes (refund_payment), every system" in table
    # A quick run says its ratios are indicative only, in both files.
    assert cfg["indicative_only"] and "one repeat" in cfg["indicative_why"]
    assert "**Indicative only:**" in table

    checks = result["checks"]
    assert checks["every_call_ended"] and checks["ended"] == checks["calls"] > 0
    red = result["redelivery"]
    assert red["exactly_one_side_effect_each"]
    for effects in red["side_effects"]:
        assert effects["operations"] == cfg["redelivery_calls"] == effects["effects"]
    # Every call of the redelivered run was enqueued twice more; each copy is traced.
    assert red["duplicate_deliveries_traced"] == [2 * cfg["redelivery_calls"]]

    assert result["fanin"]["turns"] == cfg["fanin_turns"]
    assert result["latency"]["calls"] == 20 * cfg["latency_turns"]
    assert set(result["latency"]["stages_ms"]) == {
        "submit→reserved",
        "reserved→completed",
        "completed→published",
        "submit→published",
    }
    assert result["memory"]["in_flight"] >= 1
    for kind in ("read", "write"):
        worker = result["round_trips"][kind]["phases"]["worker"]
        assert worker["pg_statements"] > 0 and worker["redis_commands"] > 0
