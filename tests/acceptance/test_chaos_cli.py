"""``callgate chaos`` as a command: bad input is one line with a stable code, the seed
replays the schedule, a scenario that cannot apply is a "not applicable" row, the catalogue
parses, and a small soak ends with zero violations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from callgate.core.errors import InputError
from callgate.ops.lab.chaos import faults, runner, scenario
from callgate.ops.lab.chaos.cli import chaos_command
from tests.acceptance.test_chaos_runner import chaos


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-scenario"], "unknown chaos scenario 'no-such-scenario'"),
        (["--all", "--seed", "x"], "--seed 'x': expected a whole number"),
        (["--all", "--seed", "-1"], "--seed '-1': expected a whole number"),
        (["--all", "--workers", "0"], "--workers '0'"),
        (["--all", "--calls", "5"], "--calls is for --soak"),
        (["--soak", "redis-flushall"], "--soak runs its own mix"),
        ([], "name scenarios or pass --all"),
    ],
)
def test_bad_input_is_one_line_with_a_stable_code(args: list[str], message: str) -> None:
    done = chaos(*args, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("callgate: invalid_input: ")
    assert message in line
    assert "Traceback" not in done.stderr


def test_the_command_runs_under_clicks_runner() -> None:
    result = CliRunner().invoke(chaos_command, ["--list"])
    assert result.exit_code == 0
    assert "worker-kill-crash-gap" in result.output
    bad = CliRunner().invoke(chaos_command, ["--all", "--seed", "x"])
    assert isinstance(bad.exception, InputError)


def test_every_catalogue_scenario_parses_and_names_its_faults() -> None:
    names = scenario.names()
    assert len(names) >= 16
    for name in names:
        sc = scenario.load(name)
        assert sc.summary and sc.workload.calls and sc.expect.outcomes
    kinds = {f.action for n in names for f in scenario.load(n).faults}
    assert kinds == set(scenario.ACTIONS)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"workload": {"turns": 1, "calls": []}}, "at least one call"),
        (
            {"workload": {"turns": 1, "calls": [{"tool": "x"}]}, "faults": [{"action": "boom"}]},
            "action must be one of",
        ),
        (
            {
                "workload": {"turns": 1, "calls": [{"tool": "x"}]},
                "faults": [{"action": "kill_worker", "at": "crash_gap"}],
            },
            "needs the tool",
        ),
        (
            {
                "workload": {"turns": 1, "calls": [{"tool": "x"}]},
                "expect": {"at_least": {"nonsense": 1}},
            },
            "counts are",
        ),
        (
            {"workload": {"turns": 1, "calls": [{"tool": "x"}]}, "stack": {"lease": 1}},
            "unknown key(s) lease",
        ),
        (
            {
                "workload": {"turns": 1, "calls": [{"tool": "x"}]},
                "faults": [{"action": "freeze_replica"}],
            },
            "needs replicated = true",
        ),
        (
            {
                "workload": {"turns": 1, "calls": [{"tool": "x"}]},
                "stack": {"replicated": True},
                "faults": [{"action": "kill_worker", "at": "crash_gap", "tool": "x"}],
            },
            "the point 'crash_gap' reads the downstream",
        ),
        (
            {
                "workload": {"turns": 1, "calls": [{"tool": "x"}]},
                "stack": {"replicated": True},
                "faults": [{"action": "fail_over", "at": "progress"}],
            },
            "fail_over needs a freeze_replica before it",
        ),
    ],
)
def test_a_bad_scenario_document_is_refused_with_its_place(
    doc: dict[str, Any], message: str
) -> None:
    with pytest.raises(InputError, match="scenario bad") as err:
        scenario.parse("bad", doc)
    assert message in err.value.message


def test_the_same_seed_replays_the_same_fault_schedule() -> None:
    sc = scenario.load("redis-flushall")

    def schedule(seed: int) -> list[dict[str, Any]]:
        return [p.as_json() for p in faults.plan(sc.faults, runner.scenario_rng(seed, sc.name))]

    assert schedule(1) == schedule(1)
    assert schedule(1) != schedule(2)
    # through the command: the schedule it reports is the one the seed draws
    first = json.loads(chaos("postgres-restart", "--seed", "11", "--json").stdout)
    again = json.loads(chaos("postgres-restart", "--seed", "11", "--json").stdout)
    assert first["scenarios"][0]["schedule"] == again["scenarios"][0]["schedule"]
    expected = faults.plan(
        scenario.load("postgres-restart").faults, runner.scenario_rng(11, "postgres-restart")
    )
    assert first["scenarios"][0]["schedule"] == [p.as_json() for p in expected]


def test_postgres_restart_is_not_applicable_on_a_server_the_runner_does_not_own() -> None:
    done = chaos("postgres-restart", "--seed", "1")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[:2]
    assert header.split()[:3] == ["scenario", "faults", "injected"]
    assert row.split()[0] == "postgres-restart" and row.split()[-1] == "n/a"
    assert "postgres-restart: not applicable: needs a PostgreSQL the runner owns" in done.stdout


def test_a_small_soak_ends_with_zero_violations() -> None:
    done = chaos("--soak", "--calls", "150", "--workers", "2", "--seed", "3", "--json")
    doc = json.loads(done.stdout)
    (row,) = doc["scenarios"]
    print(json.dumps({k: row[k] for k in ("counts", "outcomes", "faults_injected")}, indent=1))
    assert row["violations"] == [] and row["unexpected"] == []
    assert done.returncode == 0 and row["verdict"] == "pass"
    c = row["counts"]
    assert c["calls"] == 150 and c["faults"] >= 2
    assert c["side_effects"] <= c["writes"]
    assert row["recovery_seconds"] is not None
