"""Turns submitted one after another to running workers: end-to-end time as the producer sees
it (submit → ``collect`` complete), and per call the time in each stage from Postgres'
timestamps (submit → reserved → completed → published)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from callgate.ops.lab.bench import measure
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.stack import Running
from callgate.ops.lab.bench.workload import CONTEXT, Proposal


def closed_loop(run: Running, turns: Sequence[Sequence[Proposal]]) -> tuple[list[float], list[str]]:
    """Submit each turn and wait for all its results before the next; ms per turn."""
    elapsed: list[float] = []
    ids: list[str] = []
    for proposals in turns:
        started = time.perf_counter()
        turn = run.producer.submit(proposals, CONTEXT)
        collected = run.producer.collect(turn.turn_id, timeout=30)
        elapsed.append((time.perf_counter() - started) * 1000)
        if not collected.complete:
            raise BenchError(f"turn {turn.turn_id} did not complete: {collected.pending}")
        failed = [r.call_id for r in collected.results if r.status != "succeeded"]
        if failed:
            raise BenchError(f"turn {turn.turn_id}: calls {failed} did not succeed")
        ids.append(turn.turn_id)
    return elapsed, ids


def stages(run: Running, turns: Sequence[Sequence[Proposal]]) -> dict[str, Any]:
    elapsed, ids = closed_loop(run, turns)
    # collect() may read a result from Redis before the relayer's mark commits.
    deadline = time.monotonic() + 10
    while measure.unpublished(run.producer.engine, ids):
        if time.monotonic() > deadline:
            raise BenchError("latency: results still unpublished after 10s")
        time.sleep(0.05)
    per_stage = measure.stages(run.producer.engine, ids)
    return {
        "turns": len(ids),
        "calls": sum(len(t) for t in turns),
        "calls_per_turn": len(turns[0]) if turns else 0,
        "stages_ms": {name: measure.percentiles(v) for name, v in per_stage.items()},
        "turn_end_to_end_ms": measure.percentiles(elapsed),
    }
