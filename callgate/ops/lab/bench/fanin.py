"""One turn of three reads of 120, 280 and 200 ms on three running workers: end to end
(submit → ``collect`` complete) against the slowest read and against running them one
after another."""

from __future__ import annotations

from typing import Any

from callgate.ops.lab.bench import latency, ratios, workload
from callgate.ops.lab.bench.services import Services
from callgate.ops.lab.bench.stack import running

DELAYS_MS = {"get_weather": 120, "get_stock": 280, "get_news": 200}


def turns(services: Services, *, repeat: int) -> dict[str, Any]:
    delays = ",".join(f"{tool}={ms}" for tool, ms in DELAYS_MS.items())
    with running(services, workers=3, CALLGATE_DEMO_DELAY_MS=delays) as run:
        elapsed, _ = latency.closed_loop(run, [workload.fan_in()] * repeat)
    slowest, serial = max(DELAYS_MS.values()), sum(DELAYS_MS.values())
    e2e = ratios.median(elapsed)
    return {
        "turns": repeat,
        "end_to_end_ms": round(e2e, 1),
        "all_ms": [round(x, 1) for x in elapsed],
        "slowest_read_ms": slowest,
        "one_after_another_ms": serial,
        "vs_slowest": ratios.ratio(e2e, slowest),
        "vs_one_after_another": ratios.ratio(e2e, serial),
    }
