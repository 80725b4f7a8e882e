"""The figures of one throughput row, from the rates every system measured: pure
arithmetic over typed values, no I/O.

Each system's figure is the median of its repeats. callgate's ratio is given against every
baseline; two of them are named: bare RQ (the ``ratio`` the bench has always reported) and
the threaded ceiling, the fastest an executor with callgate's promises can be on the same
processes and threads (dramatiq running the minimum durable work; for writes, the minimum
durable work around the same downstream refund; for the 100 ms tools, dramatiq's sleeping
threads, beside the in-flight bound W × K / delay).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CALLGATE = "callgate"
BARE_RQ = "bare_rq"


@dataclass(frozen=True)
class System:
    """A baseline: what it is, and how many of its processes' jobs run at once."""

    label: str
    short: str
    one_at_a_time: bool  # RQ's SimpleWorker: K = 1 whatever callgate's K

    def threads(self, k: int) -> int:
        return 1 if self.one_at_a_time else k


SYSTEMS = {
    BARE_RQ: System("bare RQ (SimpleWorker, one job at a time)", "bare RQ", one_at_a_time=True),
    "rq_durable": System(
        "RQ + the minimum durable work (one job at a time)", "RQ + min durable", one_at_a_time=True
    ),
    "dramatiq": System("dramatiq (K threads per process)", "dramatiq", one_at_a_time=False),
    "dramatiq_durable": System(
        "dramatiq (K threads per process) + the minimum durable work",
        "dramatiq + min durable",
        one_at_a_time=False,
    ),
    "rq_durable_refund": System(
        "RQ + the minimum durable work + the same refund (one job at a time)",
        "RQ + min durable + refund",
        one_at_a_time=True,
    ),
    "dramatiq_durable_refund": System(
        "dramatiq (K threads per process) + the minimum durable work + the same refund",
        "dramatiq + min durable + refund",
        one_at_a_time=False,
    ),
}


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("nan")


def in_flight_bound(workers: int, k: int, delay_ms: int) -> float:
    """Calls per second when every slot of every worker always waits on a tool."""
    return workers * k * 1000 / delay_ms


def row(
    workers: int,
    k: int,
    rates: Mapping[str, Sequence[float]],
    *,
    ceiling: str | None,
    delay_ms: int | None = None,
) -> dict[str, Any]:
    """One row: callgate's and every baseline's median, callgate's ratio to each, to bare
    RQ (``ratio``, as before) and to the threaded ceiling (None when the scenario has none);
    for a scenario of ``delay_ms`` tools, the in-flight bound and the fraction of it each
    system reached."""
    cg = median(rates[CALLGATE])
    rq = median(rates[BARE_RQ])
    bound = in_flight_bound(workers, k, delay_ms) if delay_ms else None
    baselines: dict[str, dict[str, Any]] = {}
    for name, system in SYSTEMS.items():
        if not rates.get(name):
            continue
        per_s = median(rates[name])
        baselines[name] = {
            "label": system.label,
            "workers": workers,
            "threads": system.threads(k),
            "per_s": round(per_s, 1),
            "runs": [round(x, 1) for x in rates[name]],
            "callgate_ratio": ratio(cg, per_s),
        }
        if delay_ms:
            own = in_flight_bound(workers, system.threads(k), delay_ms)
            baselines[name]["of_bound"] = ratio(per_s, own)
    out: dict[str, Any] = {
        "workers": workers,
        "concurrency": k,
        "callgate_per_s": round(cg, 1),
        "baseline_per_s": round(rq, 1),
        "ratio": ratio(cg, rq),
        "callgate_runs": [round(x, 1) for x in rates[CALLGATE]],
        "baseline_runs": [round(x, 1) for x in rates[BARE_RQ]],
        "baselines": baselines,
        "threaded_ceiling": ceiling,
        "threaded_ceiling_per_s": baselines[ceiling]["per_s"] if ceiling else None,
        "ratio_to_threaded_ceiling": ratio(cg, median(rates[ceiling])) if ceiling else None,
    }
    if bound:
        out["in_flight_bound_per_s"] = round(bound, 1)
        out["callgate_of_bound"] = ratio(cg, bound)
    return out


def scaling(rows: list[dict[str, Any]]) -> None:
    """Each row's figures against the first row's (W = the smallest)."""
    first = rows[0]
    for r in rows:
        r["callgate_scaling"] = ratio(r["callgate_per_s"], first["callgate_per_s"])
        r["baseline_scaling"] = ratio(r["baseline_per_s"], first["baseline_per_s"])
