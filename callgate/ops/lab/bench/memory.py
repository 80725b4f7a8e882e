"""Memory per in-flight call: the resident memory of one worker process (and any children)
idle, then while it holds as many calls as it will take at once.

The calls sleep in their handler, so they stay in flight while memory is read; how many were
in flight is read from Redis (the jobs the worker took and holds, its taken hash: a read takes
no reservation, so Postgres does not see it start), not assumed from the setting.
Two burst workers without the delay then finish what is left.
"""

from __future__ import annotations

import time
from typing import Any, cast

from callgate.ops.lab.bench import procs, workload
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.services import Services
from callgate.ops.lab.bench.stack import running
from callgate.ops.lab.bench.workload import CONTEXT
from callgate.queue import deliveries

HOLD_MS = 1500
SETTLE_SECONDS = 1.0


def per_call(services: Services, *, concurrency: int) -> dict[str, Any]:
    with running(
        services,
        workers=1,
        CALLGATE_WORKER_CONCURRENCY=str(concurrency),
        CALLGATE_DEMO_DELAY_MS=f"get_stock={HOLD_MS}",
    ) as run:
        pid = run.workers[0].pid
        # Warm up on undelayed reads: imports and connections a first call makes.
        warm = run.producer.submit(
            [
                {
                    "call_id": f"w{i}",
                    "tool_name": "get_weather",
                    "arguments": {"city": f"C{i}", "unit": "celsius"},
                }
                for i in range(4)
            ],
            CONTEXT,
        )
        if not run.producer.collect(warm.turn_id, timeout=30).complete:
            raise BenchError("memory: the warm-up turn did not complete")
        time.sleep(0.2)
        idle = procs.rss_kib(pid)
        turns = [run.producer.submit(t, CONTEXT).turn_id for t in workload.reads(concurrency)]
        in_flight, busy = _peak(services, run.env["CALLGATE_QUEUE"], pid, expected=concurrency)
        drainers = [
            procs.callgate(["worker", "--burst"], {**run.env, "CALLGATE_DEMO_DELAY_MS": ""})
            for _ in range(2)
        ]
        procs.wait_all(drainers, "callgate worker --burst")
        procs.forget(drainers)
        for turn_id in turns:
            if not run.producer.collect(turn_id, timeout=30).complete:
                raise BenchError(f"memory: turn {turn_id} did not complete")
    return {
        "concurrency_setting": concurrency,
        "in_flight": in_flight,
        "rss_idle_mib": round(idle / 1024, 1),
        "rss_busy_mib": round(busy / 1024, 1),
        "per_in_flight_call_kib": round((busy - idle) / in_flight, 1) if in_flight else None,
    }


def _held(services: Services, queue: str) -> int:
    """Jobs the queue's workers took and hold (their taken hashes)."""
    r = services.redis
    workers = cast(set[bytes], r.smembers(deliveries.workers_key(queue)))
    held = 0
    for worker in workers:
        held += r.hlen(deliveries.taken_key(queue, worker.decode()))
    return held


def _peak(services: Services, queue: str, pid: int, *, expected: int) -> tuple[int, int]:
    """Sample until ``expected`` calls are in flight or the count stops growing."""
    deadline = time.monotonic() + SETTLE_SECONDS
    best, rss = 0, procs.rss_kib(pid)
    while time.monotonic() < deadline:
        now = _held(services, queue)
        if now > best:
            best, rss = now, procs.rss_kib(pid)
            if best >= expected:
                break
        time.sleep(0.05)
    return best, rss
