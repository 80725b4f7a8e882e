"""The load model: which tier a fleet saturates first, and the input it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from callgate.core.errors import ErrorCode, InputError
from callgate.ops.lab.bench import load_model
from callgate.ops.lab.bench.load_model import Fleet, parse_mix, predict


def kind(**over: float) -> dict[str, float]:
    base = {
        "pg_cpu_ms_per_call": 2.0,
        "worker_cpu_ms_per_call": 4.0,
        "relayer_cpu_ms_per_call": 0.5,
        "redis_cpu_ms_per_call": 0.1,
        "redis_commands_per_call": 10.0,
        "pg_connections_per_worker": 6.0,
        "pg_connections_per_relayer": 2.0,
    }
    return {**base, **over}


def costs(**kinds: dict[str, float]) -> dict[str, Any]:
    return {"machine": {"pg_max_connections": 100}, "kinds": kinds or {"reads": kind()}}


def first(fleet: Fleet, handler_ms: float = 0.0, mix: str = "reads=1") -> str:
    return predict(costs(), fleet, parse_mix(mix), handler_ms).first.name


def test_capacities_are_cores_over_cpu_per_call() -> None:
    p = predict(costs(), Fleet(workers=2, concurrency=8, pg_cores=2), {"reads": 1.0}, 0.0)
    got = {t.name: round(t.capacity) for t in p.tiers}
    # Postgres 2 cores / 2 ms; workers 2 × 1 core / 4 ms (slots: 16 / 4 ms = 4000);
    # relayer 1 core / 0.5 ms; Redis 1 thread / 0.1 ms.
    assert got == {"postgres": 1000, "workers": 500, "relayer": 2000, "redis": 10000}
    assert p.first.name == "workers" and "CPU" in p.first.bound
    assert p.connections == 2 * 6 + 2 and p.connections_fit


def test_more_workers_move_the_bottleneck_to_postgres_then_more_cores_to_the_relayer() -> None:
    assert first(Fleet(workers=1, concurrency=8, pg_cores=2)) == "workers"
    assert first(Fleet(workers=8, concurrency=8, pg_cores=2)) == "postgres"
    assert first(Fleet(workers=16, concurrency=8, pg_cores=16)) == "relayer"
    # Relayers scale it out; Redis is next (one thread), then more Redis servers (by queue).
    assert first(Fleet(workers=64, concurrency=8, pg_cores=64, relayers=16)) == "redis"
    spread = Fleet(workers=64, concurrency=8, pg_cores=64, relayers=16, redis_servers=4)
    assert first(spread) == "workers"


def test_slow_handlers_make_the_slots_the_bound_until_k_grows() -> None:
    slow = Fleet(workers=4, concurrency=8, pg_cores=8)
    p = predict(costs(), slow, {"reads": 1.0}, 100.0)
    assert p.first.name == "workers" and p.first.bound.startswith("slots")
    assert p.first.capacity == pytest.approx(4 * 8 * 1000 / 104)
    # The same fleet at K=256: the slots hold 10x more, so the workers' CPU binds instead.
    wide = predict(costs(), Fleet(4, 256, 8), {"reads": 1.0}, 100.0).first
    assert wide.name == "workers" and wide.bound.startswith("CPU")


def test_a_worker_counts_one_core_at_most() -> None:
    one = predict(costs(), Fleet(2, 8, 8, worker_cores=1.0), {"reads": 1.0}, 0.0)
    four = predict(costs(), Fleet(2, 8, 8, worker_cores=4.0), {"reads": 1.0}, 0.0)
    assert one.first.capacity == four.first.capacity == 500


def test_the_mix_weights_each_kinds_costs() -> None:
    doc = costs(reads=kind(pg_cpu_ms_per_call=1.0), writes=kind(pg_cpu_ms_per_call=5.0))
    p = predict(doc, Fleet(64, 8, 1), parse_mix("reads=0.75,writes=0.25"), 0.0)
    assert p.per_call["pg_cpu_ms_per_call"] == pytest.approx(2.0)
    assert p.first.name == "postgres" and p.first.capacity == pytest.approx(500)


def test_too_many_connections_is_what_saturates_first() -> None:
    p = predict(costs(), Fleet(workers=20, concurrency=8, pg_cores=64), {"reads": 1.0}, 0.0)
    assert p.connections == 20 * 6 + 2 and not p.connections_fit
    assert "saturates first: Postgres connections" in load_model.render(p)
    fits = predict(costs(), Fleet(20, 8, 64, pg_max_connections=500), {"reads": 1.0}, 0.0)
    assert fits.connections_fit


@pytest.mark.parametrize(
    ("mix", "says"),
    [
        ("reads=0.8,deletes=0.2", "unknown kind 'deletes'"),
        ("reads=0.8,writes=0.3", "sum to 1.1, not 1"),
        ("reads=0.5", "sum to 0.5, not 1"),
        ("reads", "expected kind=share"),
        ("", "expected kind=share"),
        ("reads=x,writes=1", "'x' is not a number"),
        ("reads=1.5,writes=-0.5", "outside 0..1"),
        ("reads=0.5,reads=0.5", "reads given twice"),
    ],
)
def test_a_bad_mix_is_refused_with_a_stable_code(mix: str, says: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_mix(mix)
    assert caught.value.code == ErrorCode.INVALID_INPUT and says in caught.value.message


def test_a_kind_not_measured_or_a_cost_not_positive_is_refused() -> None:
    with pytest.raises(InputError, match="writes were not measured"):
        predict(costs(), Fleet(1, 8, 1), {"reads": 0.5, "writes": 0.5}, 0.0)
    with pytest.raises(InputError, match=r"reads\.redis_cpu_ms_per_call is -0\.01"):
        predict(costs(reads=kind(redis_cpu_ms_per_call=-0.01)), Fleet(1, 8, 1), {"reads": 1}, 0)
    with pytest.raises(InputError, match="--workers 0: must be positive"):
        predict(costs(), Fleet(0, 8, 1), {"reads": 1.0}, 0.0)
    with pytest.raises(InputError, match="no 'kinds'"):
        predict({}, Fleet(1, 8, 1), {"reads": 1.0}, 0.0)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "callgate", "bench", "model", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_prints_the_table_and_bad_input_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs(reads=kind(), writes=kind(worker_cpu_ms_per_call=8.0))))
    fleet = ["--workers", "4", "--concurrency", "32", "--pg-cores", "4"]
    ok = cli("--costs", str(path), *fleet, "--mix", "reads=0.8,writes=0.2", "--handler-ms", "100")
    assert ok.returncode == 0, ok.stderr
    assert "saturates first: workers at 833 calls/s" in ok.stdout

    for args, line in (
        (
            ["--costs", str(tmp_path / "none.json"), *fleet],
            f"callgate: invalid_input: --costs {tmp_path / 'none.json'}: no such file",
        ),
        (
            ["--costs", str(path), *fleet, "--mix", "reads=0.8,deletes=0.2"],
            "callgate: invalid_input: --mix 'reads=0.8,deletes=0.2': unknown kind 'deletes' "
            "(known: reads, writes)",
        ),
        (
            ["--costs", str(path), *fleet, "--mix", "reads=0.8,writes=0.1"],
            "callgate: invalid_input: --mix 'reads=0.8,writes=0.1': the shares sum to 0.9, not 1",
        ),
    ):
        bad = cli(*args)
        assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [line]
        assert "Traceback" not in bad.stderr
