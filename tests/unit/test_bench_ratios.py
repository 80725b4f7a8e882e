"""The bench's arithmetic and its quick-run note: pure functions over made-up rates."""

from __future__ import annotations

import math
from typing import Any

import pytest

from callgate.ops.lab.bench import ratios, report
from callgate.ops.lab.bench.config import FULL, QUICK, STABLE_CALLS, Config

RATES = {
    "callgate": [400.0, 500.0, 450.0],
    "bare_rq": [200.0, 210.0, 190.0],
    "rq_durable": [130.0, 140.0, 120.0],
    "dramatiq": [1800.0, 1900.0, 1700.0],
    "dramatiq_durable": [900.0, 800.0, 1000.0],
}

# Writes: bare RQ's refunds, and the minimum durable work around the same refund.
WRITE_RATES = {
    "callgate": [300.0, 280.0, 320.0],
    "bare_rq": [150.0, 160.0, 140.0],
    "rq_durable_refund": [100.0, 90.0, 110.0],
    "dramatiq_durable_refund": [600.0, 640.0, 560.0],
}


def test_a_row_gives_callgates_ratio_to_bare_rq_and_to_the_threaded_ceiling() -> None:
    row = ratios.row(2, 8, RATES, ceiling="dramatiq_durable")
    assert row["callgate_per_s"] == 450.0  # the median of the repeats, not the mean
    assert row["baseline_per_s"] == 200.0
    assert row["ratio"] == 2.25
    assert row["threaded_ceiling"] == "dramatiq_durable"
    assert row["threaded_ceiling_per_s"] == 900.0
    assert row["ratio_to_threaded_ceiling"] == 0.5
    assert row["callgate_runs"] == [400.0, 500.0, 450.0]
    assert row["baseline_runs"] == [200.0, 210.0, 190.0]


def test_every_baseline_states_its_processes_and_threads() -> None:
    row = ratios.row(2, 8, RATES, ceiling="dramatiq_durable")
    got = {name: (b["workers"], b["threads"], b["per_s"]) for name, b in row["baselines"].items()}
    assert got == {
        "bare_rq": (2, 1, 200.0),  # SimpleWorker: one job at a time whatever K is
        "rq_durable": (2, 1, 130.0),
        "dramatiq": (2, 8, 1800.0),
        "dramatiq_durable": (2, 8, 900.0),
    }
    assert row["baselines"]["dramatiq"]["callgate_ratio"] == 0.25
    assert row["baselines"]["rq_durable"]["callgate_ratio"] == round(450 / 130, 2)


def test_writes_are_read_against_the_minimum_durable_work_around_the_same_refund() -> None:
    row = ratios.row(2, 8, WRITE_RATES, ceiling="dramatiq_durable_refund")
    assert row["ratio"] == 2.0  # 300 ÷ bare RQ's 150, as before
    assert row["threaded_ceiling_per_s"] == 600.0
    assert row["ratio_to_threaded_ceiling"] == 0.5
    got = {name: (b["workers"], b["threads"], b["per_s"]) for name, b in row["baselines"].items()}
    assert got == {
        "bare_rq": (2, 1, 150.0),
        "rq_durable_refund": (2, 1, 100.0),  # SimpleWorker: one refund at a time
        "dramatiq_durable_refund": (2, 8, 600.0),
    }
    assert row["baselines"]["rq_durable_refund"]["callgate_ratio"] == 3.0
    assert "same refund" in row["baselines"]["dramatiq_durable_refund"]["label"]


def test_a_scenario_without_a_ceiling_reports_none_and_only_what_ran() -> None:
    rates = {"callgate": [10.0], "bare_rq": [20.0]}
    row = ratios.row(1, 8, rates, ceiling=None)
    assert row["ratio"] == 0.5
    assert row["threaded_ceiling_per_s"] is None and row["ratio_to_threaded_ceiling"] is None
    assert list(row["baselines"]) == ["bare_rq"]


def test_slow_tools_are_read_against_the_in_flight_bound() -> None:
    rates = {"callgate": [332.0], "bare_rq": [19.0], "dramatiq": [542.0]}
    row = ratios.row(2, 32, rates, ceiling="dramatiq", delay_ms=100)
    assert row["in_flight_bound_per_s"] == 640.0  # 2 processes × 32 in flight / 0.1 s
    assert row["callgate_of_bound"] == round(332 / 640, 2)
    assert row["baselines"]["dramatiq"]["of_bound"] == round(542 / 640, 2)
    assert row["baselines"]["bare_rq"]["of_bound"] == round(19 / 20, 2)  # its bound: 2 × 1


def test_scaling_is_against_the_first_row_and_a_zero_baseline_is_not_a_ratio() -> None:
    rows = [ratios.row(w, 8, RATES, ceiling=None) for w in (1, 2)]
    rows[1]["callgate_per_s"] = 900.0
    ratios.scaling(rows)
    assert rows[0]["callgate_scaling"] == 1.0 and rows[1]["callgate_scaling"] == 2.0
    assert math.isnan(ratios.ratio(1.0, 0.0))


def _config(**preset: Any) -> Config:
    return Config(
        workers=preset["workers"],
        calls=preset["calls"],
        repeat=preset["repeat"],
        concurrency=32,
        quick=preset is QUICK,
    )


def test_a_quick_run_records_that_its_ratios_are_indicative_only() -> None:
    quick = _config(**QUICK)
    assert quick.calls >= STABLE_CALLS  # enough calls; the one repeat still makes it a hint
    as_json = quick.as_json()
    assert as_json["indicative_only"] is True
    assert "one repeat" in str(as_json["indicative_why"])

    few = Config(workers=(1,), calls=60, repeat=3, concurrency=32, quick=False)
    assert few.indicative_why is not None and "60 calls per run" in few.indicative_why

    full = _config(**FULL).as_json()
    assert full["indicative_only"] is False and full["indicative_why"] is None


@pytest.mark.parametrize("quick", [True, False])
def test_the_report_prints_the_note_and_the_ceiling(quick: bool) -> None:
    config = _config(**(QUICK if quick else FULL))
    noop = [ratios.row(w, 8, RATES, ceiling="dramatiq_durable") for w in config.workers]
    write = [
        ratios.row(w, 8, WRITE_RATES, ceiling="dramatiq_durable_refund") for w in config.workers
    ]
    io = [ratios.row(w, 32, RATES, ceiling=None) for w in config.workers]
    for rows in (noop, write, io):
        ratios.scaling(rows)
    result = {
        "config": config.as_json(),
        "throughput": {
            "noop": {"baseline": "bare RQ, no-op job", "rows": noop},
            "write": {"baseline": "bare RQ, same downstream refund", "rows": write},
            "io": {"baseline": "bare RQ, 100 ms sleep job", "rows": io},
        },
        "redelivery": {
            "thrice_per_s": 1.0,
            "once_per_s": 1.0,
            "ratio": 1.0,
            "side_effects": [],
            "exactly_one_side_effect_each": True,
            "duplicate_deliveries_traced": [],
        },
        "checks": {"every_call_ended": True, "ended": 1, "calls": 1},
    }
    table = report.markdown(result, "callgate bench")
    assert ("**Indicative only:**" in table) is quick
    # The no-op and write rows carry their ceiling and callgate's ratio to it; a scenario
    # without a ceiling leaves both cells blank.
    assert "| No-op reads (get_stock) | 1 | 8 | 450 | bare RQ, no-op job | 200 | 2.25× " in table
    assert "| 900 | 0.50× |" in table
    assert (
        "| Writes (refund_payment) | 1 | 8 | 300 | bare RQ, same downstream refund | 150 "
        "| 2.00× | 1.00× | 1.00× | 600 | 0.50× |" in table
    )
    assert "| 100 ms tools | 1 | 32 | 450 |" in table
    assert "| 1.00× | 1.00× |  |  |" in table
    assert (
        "| dramatiq (K threads per process) + the minimum durable work (threaded ceiling) " in table
    )
    assert "| **callgate** | 1 | 8 | 450 | 1.00× |" in table
    # The writes get their every-system table, as the reads do.
    writes = table.split("Writes (refund_payment), every system")[1]
    assert writes.startswith(
        " (W processes × threads each; ceiling = dramatiq (K threads per process) + the "
        "minimum durable work + the same refund):"
    )
    assert (
        "| dramatiq (K threads per process) + the minimum durable work + the same refund "
        "(threaded ceiling) | 1 | 8 | 600 | 0.50× |" in writes
    )
    assert (
        "| RQ + the minimum durable work + the same refund (one job at a time) | 1 | 1 | 100 "
        "| 3.00× |" in writes
    )
    assert "| **callgate** | 1 | 8 | 300 | 1.00× |" in writes
    assert "100 ms tools, every system" not in table
