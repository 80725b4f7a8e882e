"""``callgate chaos --soak``: a long mixed run of reads and writes with faults from the
catalogue injected throughout, judged by the same invariants as every scenario.

Turns of 1-4 calls (about 60 % reads: get_weather, get_stock, get_news; writes:
refund_payment of a few KRW, send_email, charge_unkeyed) are submitted while at most
``IN_FLIGHT`` calls are open, so faults land on calls in every stage. Every ``calls /
faults`` calls one fault is drawn: a worker SIGKILLed (and replaced), a worker SIGSTOPped
for two leases, jobs of recent calls enqueued again, the relayer SIGKILLed (and restarted),
the sweeper SIGKILLed (and restarted a second later), Redis flushed or restarted (the
runner's own), the backends of workers, relayer, sweeper and downstreams terminated (the
producer's own are left to the ``postgres-terminate`` scenario). Every random choice comes
from the seed.
"""

from __future__ import annotations

import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from callgate.core.errors import CallgateError
from callgate.ops.lab.chaos import faults, invariants, runner
from callgate.ops.lab.chaos.faults import Live, PlannedFault
from callgate.ops.lab.chaos.scenario import Expect, FaultSpec, Scenario, StackSpec, Workload
from callgate.ops.lab.chaos.services import Services, terminate_backends
from callgate.ops.stack import wait_for_workers
from callgate.queue import transport

IN_FLIGHT = 40
CALLS_PER_FAULT = 60
READS = (
    ("get_weather", lambda n: {"city": f"City{n % 50}", "unit": "celsius"}),
    ("get_stock", lambda n: {"symbol": f"S{n % 30}"}),
    ("get_news", lambda n: {"topic": f"topic {n % 20}"}),
)
WRITES = (
    # the amount differs within a turn: an identical write twice in one turn is one call
    ("refund_payment", lambda n: {"order_id": "O-17", "amount": 1 + n % 10, "currency": "KRW"}),
    ("send_email", lambda n: {"to": f"soak{n}@chaos.test", "template": "hello"}),
    ("charge_unkeyed", lambda n: {"amount": 1, "reference": f"soak-{n}"}),
)
# Drawn with these weights.
FAULTS = (
    ("kill_worker", 4),
    ("stop_worker", 2),
    ("duplicate", 2),
    ("kill_relayer", 1),
    ("kill_sweeper", 1),
    ("flush_redis", 1),
    ("restart_redis", 1),
    ("terminate_backends", 2),
)
SOAK_STACK = StackSpec(
    lease_seconds=2.0,
    sweep_seconds=0.5,
    stale_seconds=3.0,
    delays="refund_payment=0:100,send_email=0:100,charge_unkeyed=0:100,get_stock=20",
    replacement_delays=True,
    own_redis=True,
)
EXPECT = Expect(
    outcomes={
        "get_weather": ("succeeded",),
        "get_stock": ("succeeded",),
        "get_news": ("succeeded",),
        "refund_payment": ("succeeded",),
        "send_email": ("succeeded",),
        # an unguarded write whose worker died after it started goes to a person
        "charge_unkeyed": ("succeeded", "reconciliation_pending"),
    }
)
RECOVERY_SECONDS = 90.0


@dataclass
class _Pending:
    """Faults that end later: a stopped worker to resume, a sweeper to restart."""

    resume: list[tuple[float, str]] = field(default_factory=list)
    restart_sweeper_at: float | None = None

    def due(self, live: Live, *, flush: bool = False) -> None:
        now = time.monotonic()
        for at, name in list(self.resume):
            if flush or now >= at:
                live.stack.signal(name, signal.SIGCONT)
                self.resume.remove((at, name))
        if self.restart_sweeper_at is not None and (flush or now >= self.restart_sweeper_at):
            live.stack.start("sweeper", ["sweeper"])
            self.restart_sweeper_at = None


def run_soak(
    services: Services, *, calls: int, workers: int, seed: int, log_dir: Path | None = None
) -> runner.Report:
    """Run the soak and judge it like a scenario (its row is named ``soak``)."""
    started = time.monotonic()
    rng = runner.scenario_rng(seed, "soak")
    spec = StackSpec(**{**SOAK_STACK.__dict__, "workers": workers})
    scenario = Scenario(
        name="soak",
        summary=f"{calls} calls, {workers} workers, random faults throughout",
        stack=spec,
        workload=Workload(turns=0, calls=()),
        faults=(),
        expect=EXPECT,
        recovery_seconds=RECOVERY_SECONDS,
    )
    report = runner.Report("soak", scenario.summary, "pass")
    live = runner.prepare_live(services, "soak", spec, log_dir, own_redis=True, own_postgres=False)
    report.log = live.stack.log_path
    owned, stack, engine, producer = live.redis, live.stack, live.engine, live.producer
    redis_url, settings = live.env["CALLGATE_REDIS_URL"], producer.settings
    kinds = [k for k, _ in FAULTS if owned is not None or "redis" not in k]
    weights = [w for k, w in FAULTS if k in kinds]
    pending = _Pending()
    last_fault_at: Any = None
    try:
        stack.__enter__()
        wait_for_workers(redis_url, settings.queue, workers)
        with click.progressbar(length=calls, label="soak", file=sys.stderr) as bar:
            submitted, turn, next_fault, shown = 0, 0, CALLS_PER_FAULT // 2, 0
            while submitted < calls:
                pending.due(live)
                done = invariants.terminal_count(engine)
                bar.update(done - shown)
                shown = done
                if submitted - done >= IN_FLIGHT:
                    time.sleep(0.05)
                    continue
                size = min(rng.randint(1, 4), calls - submitted)
                runner.submit_turn(live, _turn(rng, turn, size), f"soak-{turn}")
                submitted += size
                turn += 1
                if submitted >= next_fault:
                    kind = rng.choices(kinds, weights)[0]
                    report.faults.append(_fault(live, kind, rng, pending))
                    last_fault_at = runner._now(engine)
                    next_fault += CALLS_PER_FAULT
            pending.due(live, flush=True)
            last_fault_at = runner._now(engine) if last_fault_at is None else last_fault_at
            deadline = time.monotonic() + RECOVERY_SECONDS
            while shown < calls and time.monotonic() < deadline:
                done = invariants.terminal_count(engine)
                bar.update(done - shown)
                shown = done
                time.sleep(0.1)
        report.violations.extend(runner.fan_in(live))
    except CallgateError as exc:
        report.violations.append(f"the runner's own call failed: {exc}")
    finally:
        stack.stop()
        producer.close()
        if owned is not None:
            owned.stop()
    try:
        runner.judge(report, scenario, engine, last_fault_at)
    finally:
        engine.dispose()
    report.seconds = time.monotonic() - started
    return report


def _turn(rng: random.Random, turn: int, size: int) -> list[dict[str, Any]]:
    proposals = []
    for i in range(size):
        n = turn * 10 + i
        tool, arguments = rng.choice(READS) if rng.random() < 0.6 else rng.choice(WRITES)
        proposals.append(
            {"call_id": f"s{turn}-{i}-{tool}", "tool_name": tool, "arguments": arguments(n)}
        )
    return proposals


def _fault(live: Live, kind: str, rng: random.Random, pending: _Pending) -> dict[str, Any]:
    draw = rng.random()
    done: dict[str, Any] = {"action": kind}
    alive = live.workers()
    if kind == "stop_worker":
        if len(alive) > 1:  # never every worker at once: the stopped one comes back later
            victim = alive[int(draw * len(alive))]
            live.stack.signal(victim, signal.SIGSTOP)
            pending.resume.append((time.monotonic() + 2 * live.spec.lease_seconds, victim))
            done["stopped"] = [victim]
        return done
    if kind == "kill_sweeper":
        if "sweeper" in live.stack.alive():
            live.stack.signal("sweeper", signal.SIGKILL)
            live.stack.procs["sweeper"].wait()
            pending.restart_sweeper_at = time.monotonic() + 1.0
            done["killed"] = ["sweeper"]
        return done
    if kind == "terminate_backends":
        done["terminated"] = terminate_backends(
            live.admin_url,
            live.database,
            faults.CONTROL_APP,
            only=["callgate-worker", "callgate-relayer", "callgate-sweeper", "callgate-downstream"],
        )
        return done
    if kind == "duplicate":
        recent = [uuid.UUID(c.ref) for c in live.calls[-5:]]
        done["jobs"] = transport.enqueue_calls(live.producer.queue, recent * 2, timeout=300)
        return done
    if kind == "kill_worker":
        spec = FaultSpec(action="kill_worker", victim="random", restart=True)
    elif kind == "kill_relayer":
        spec = FaultSpec(action="kill_relayer", restart=True)
    else:
        spec = FaultSpec(action=kind, seconds=1.0)
    planned = PlannedFault(spec=spec, jitter_s=0.0, victim_draw=draw, call_draw=0.0)
    return faults.inject(live, planned, {}, RECOVERY_SECONDS)
