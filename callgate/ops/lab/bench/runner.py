"""Plans a bench as a list of steps (the baselines and callgate interleaved, the order flipped
on every repeat), runs them under a progress bar and reduces them to medians and ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from callgate.core.settings import Settings
from callgate.ops.lab.bench import (
    bare,
    fanin,
    latency,
    memory,
    pipeline,
    ratios,
    redelivery,
    threaded,
    workload,
)
from callgate.ops.lab.bench.config import IO_DELAY_MS, Config
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.services import Services
from callgate.ops.lab.bench.stack import running

# What a `callgate worker` runs at once when nothing says otherwise.
DEFAULT_CONCURRENCY = Settings().worker_concurrency

SCENARIOS = ("noop", "write", "io")
BASELINE = {
    "noop": "bare RQ, no-op job",
    "write": "bare RQ, same downstream refund",
    "io": "bare RQ, 100 ms sleep job",
}
# The systems each scenario runs beside callgate (ratios.SYSTEMS says what each is), and the
# one that is its threaded ceiling: the same processes and threads, doing the least work an
# executor with callgate's promises must do (for writes, around the same downstream refund).
BASELINES = {
    "noop": ("bare_rq", "rq_durable", "dramatiq", "dramatiq_durable"),
    "write": ("bare_rq", "rq_durable_refund", "dramatiq_durable_refund"),
    "io": ("bare_rq", "dramatiq"),
}
CEILING = {"noop": "dramatiq_durable", "write": "dramatiq_durable_refund", "io": "dramatiq"}


@dataclass(frozen=True)
class Step:
    label: str
    run: Callable[[], None]


class Bench:
    def __init__(self, config: Config, services: Services) -> None:
        self.config = config
        self.services = services
        # scenario → workers → side → one figure per repeat
        self.rates: dict[str, dict[int, dict[str, list[float]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list))
        )
        self.redelivery: dict[str, list[float]] = defaultdict(list)
        self.effects: list[dict[str, int]] = []
        self.duplicates: list[int] = []
        self.extra: dict[str, Any] = {}
        self.seconds: list[tuple[str, float]] = []  # (step, seconds) in the order run
        self.ended: list[tuple[int, int]] = []  # (calls, calls ended) of every callgate run

    # --- the plan -------------------------------------------------------------------------

    def steps(self) -> list[Step]:
        cfg = self.config
        steps: list[Step] = []
        for r in range(cfg.repeat):
            order = cfg.workers if r % 2 == 0 else tuple(reversed(cfg.workers))
            for w in order:
                for scenario in SCENARIOS:
                    group = [self._callgate(scenario, w)]
                    group += [self._baseline(scenario, b, w) for b in BASELINES[scenario]]
                    steps += group if r % 2 == 0 else group[::-1]
            pair = [self._redelivered(1), self._redelivered(3)]
            steps += pair if r % 2 == 0 else pair[::-1]
        steps += [
            Step("fan-in 120/280/200 ms", self._fanin),
            Step("latency per stage", self._latency),
            Step(f"memory, K={cfg.concurrency}", self._memory),
            Step("round trips, reads", lambda: self._roundtrips("read")),
            Step("round trips, writes", lambda: self._roundtrips("write")),
        ]
        return steps

    def _callgate(self, scenario: str, w: int) -> Step:
        cfg = self.config

        def run() -> None:
            s = self.services
            # No-op reads and writes run at the worker's default concurrency, as users get it.
            k = str(DEFAULT_CONCURRENCY)
            if scenario == "noop":
                result = pipeline.burst(
                    s, workload.reads(cfg.calls), workers=w, CALLGATE_WORKER_CONCURRENCY=k
                )
            elif scenario == "write":
                result = pipeline.burst(
                    s,
                    workload.refunds(s.engine, cfg.calls),
                    workers=w,
                    CALLGATE_WORKER_CONCURRENCY=k,
                )
            else:
                result = pipeline.burst(
                    s,
                    workload.reads(cfg.io_calls),
                    workers=w,
                    CALLGATE_DEMO_DELAY_MS=f"get_stock={IO_DELAY_MS}",
                    CALLGATE_WORKER_CONCURRENCY=str(cfg.concurrency),
                )
            self.ended.append((result.window.calls, result.window.terminal))
            self.rates[scenario][w]["callgate"].append(result.window.per_second())

        return Step(f"callgate {scenario}, W={w}", run)

    def _baseline(self, scenario: str, system: str, w: int) -> Step:
        cfg = self.config
        k = self._k(scenario)

        def run() -> None:
            s = self.services
            calls = cfg.io_calls if scenario == "io" else cfg.calls
            rate: float
            if system == "bare_rq":
                if scenario == "noop":
                    jobs = bare.noops(calls)
                elif scenario == "write":
                    jobs = bare.refunds(s, calls)
                else:
                    jobs = bare.sleeps(cfg.bare_io_calls, IO_DELAY_MS)
                rate = bare.burst(s, jobs, workers=w)
            elif system == "rq_durable":
                rate = bare.durable_burst(s, calls, workers=w).per_second()
            elif system == "rq_durable_refund":
                rate = bare.durable_refunds(s, calls, workers=w).per_second()
            elif system == "dramatiq" and scenario == "io":
                found = threaded.sleeps(s, calls, IO_DELAY_MS, processes=w, threads=k)
                rate = found.per_second()
            elif system == "dramatiq":
                rate = threaded.noops(s, calls, processes=w, threads=k).per_second()
            elif system == "dramatiq_durable_refund":
                rate = threaded.durable_refunds(s, calls, processes=w, threads=k).per_second()
            else:
                rate = threaded.durable_burst(s, calls, processes=w, threads=k).per_second()
            self.rates[scenario][w][system].append(rate)

        return Step(f"{ratios.SYSTEMS[system].short} {scenario}, W={w}", run)

    def _k(self, scenario: str) -> int:
        """Calls in flight per worker process: the default for no-op reads and writes (as
        users get it), --concurrency for the 100 ms tools."""
        return self.config.concurrency if scenario == "io" else DEFAULT_CONCURRENCY

    def _redelivered(self, deliveries: int) -> Step:
        def run() -> None:
            s = self.services
            # One write per turn: every copy of every call is runnable at once.
            turns = workload.refunds(s.engine, self.config.redelivery_calls, per_turn=1)
            result = pipeline.burst(s, turns, workers=4, deliveries=deliveries)
            self.ended.append((result.window.calls, result.window.terminal))
            self.effects.append(redelivery.check_effects(s.engine, result.turns))
            if deliveries > 1:
                self.duplicates.append(result.window.duplicates)
            rate = result.window.per_second(until_last_event=True)
            self.redelivery[f"x{deliveries}"].append(rate)

        return Step(f"writes delivered {deliveries}×, W=4", run)

    def _fanin(self) -> None:
        self.extra["fanin"] = fanin.turns(self.services, repeat=self.config.fanin_turns)

    def _latency(self) -> None:
        w = min(2, max(self.config.workers))
        with running(self.services, workers=w) as run:
            found = latency.stages(run, workload.reads(self.config.latency_turns * 20))
        self.extra["latency"] = {"workers": w, **found}

    def _memory(self) -> None:
        self.extra["memory"] = memory.per_call(self.services, concurrency=self.config.concurrency)

    def _roundtrips(self, kind: str) -> None:
        env = {
            "CALLGATE_DATABASE_URL": self.services.database_url,
            "CALLGATE_REDIS_URL": self.services.redis_url,
        }
        argv = [sys.executable, "-m", "callgate.ops.lab.bench.roundtrips", "--json", "--kind", kind]
        argv += ["--calls", str(self.config.roundtrip_calls)]
        done = subprocess.run(
            argv, env={**_environ(), **env}, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise BenchError(f"round trips ({kind}): {done.stderr.strip().splitlines()[-1:]}")
        self.extra.setdefault("round_trips", {})[kind] = json.loads(done.stdout.splitlines()[-1])

    # --- running and reducing -------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        steps = self.steps()
        with click.progressbar(
            steps,
            label="callgate bench",
            file=sys.stderr,
            show_pos=True,
            item_show_func=lambda s: s.label if s else "",
        ) as bar:
            for step in bar:
                if not sys.stderr.isatty():  # a log shows each step; a terminal, the bar
                    click.echo(f"  {step.label}", err=True)
                started = time.monotonic()
                step.run()
                self.seconds.append((step.label, round(time.monotonic() - started, 1)))
        return self.summary()

    def summary(self) -> dict[str, Any]:
        cfg = self.config
        throughput: dict[str, Any] = {}
        for scenario in SCENARIOS:
            rows = [
                ratios.row(
                    w,
                    self._k(scenario),
                    self.rates[scenario][w],
                    ceiling=CEILING[scenario],
                    delay_ms=IO_DELAY_MS if scenario == "io" else None,
                )
                for w in cfg.workers
            ]
            ratios.scaling(rows)
            throughput[scenario] = {"baseline": BASELINE[scenario], "rows": rows}
        once, thrice = (ratios.median(self.redelivery[k]) for k in ("x1", "x3"))
        return {
            "config": cfg.as_json(),
            "throughput": throughput,
            "redelivery": {
                "workers": 4,
                "calls": cfg.redelivery_calls,
                "once_per_s": round(once, 1),
                "thrice_per_s": round(thrice, 1),
                "ratio": ratios.ratio(thrice, once),
                "duplicate_deliveries_traced": self.duplicates,
                "side_effects": self.effects,
                "exactly_one_side_effect_each": all(
                    e["exactly_once"] == e["operations"] for e in self.effects
                ),
            },
            "checks": {
                "callgate_runs": len(self.ended),
                "calls": sum(c for c, _ in self.ended),
                "ended": sum(e for _, e in self.ended),
                "every_call_ended": all(c == e for c, e in self.ended),
            },
            **self.extra,
            "step_seconds": self.seconds,
        }


def _environ() -> dict[str, str]:
    return dict(os.environ)
