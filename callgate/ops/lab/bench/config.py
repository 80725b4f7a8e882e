"""What one ``callgate bench`` run measures, and how much of it."""

from __future__ import annotations

from dataclasses import dataclass

QUICK = {"workers": (1, 2), "calls": 400, "repeat": 1}
FULL = {"workers": (1, 2, 4), "calls": 1000, "repeat": 3}
# Below this many calls per run a throughput figure is not one to compare: the fastest
# baselines finish a run in a few tens of milliseconds, where a scheduling hiccup of one
# process on a shared machine moves the figure by more than 10%. Measured on a loaded 2-core
# machine (5 systems, 3 runs each at 100, 200 and 400 calls): see docs/operations.md.
STABLE_CALLS = 400
DEFAULT_CONCURRENCY = 32
IO_DELAY_MS = 100


@dataclass(frozen=True)
class Config:
    workers: tuple[int, ...]
    calls: int
    repeat: int
    concurrency: int
    quick: bool

    @property
    def indicative_why(self) -> str | None:
        """Why this run's ratios are indicative only, or None when they can be compared."""
        why: list[str] = []
        if self.calls < STABLE_CALLS:
            why.append(
                f"{self.calls} calls per run, below the {STABLE_CALLS} that give figures "
                "stable within about 10%"
            )
        if self.repeat == 1:
            why.append("one repeat, so no median smooths a disturbed run")
        if not why:
            return None
        return "; ".join(why) + ". Compare full runs (`callgate bench`), not these."

    @property
    def io_calls(self) -> int:
        """100 ms tools, for callgate and the threaded ceiling: a quick run's fill W = 1 ×
        K = 32 slots twice; a full run's last over a second at W = 2's bound of 640/s.
        Every system's window opens at its first call and closes at its last, so it holds
        the moment its second process joins: on this 2-core machine the processes of one
        run took their first calls 10–200 ms apart. At 320 calls (half a second at the
        bound) a gap of 166 ms alone took a quarter off a run's figure."""
        return min(self.calls, 64 if self.quick else 1000)

    @property
    def bare_io_calls(self) -> int:
        """100 ms tools for bare RQ: one job at a time per process, so its rate is W / 0.1 s
        whatever the count, and each call costs it a tenth of a second."""
        return min(self.io_calls, 32 if self.quick else 64)

    @property
    def redelivery_calls(self) -> int:
        return min(self.calls, 40 if self.quick else 200)

    @property
    def latency_turns(self) -> int:
        return 3 if self.quick else 20

    @property
    def fanin_turns(self) -> int:
        return 3 if self.quick else 10

    @property
    def roundtrip_calls(self) -> int:
        return 40 if self.quick else 200

    def as_json(self) -> dict[str, object]:
        return {
            "workers": list(self.workers),
            "calls": self.calls,
            "repeat": self.repeat,
            "concurrency": self.concurrency,
            "quick": self.quick,
            "indicative_only": self.indicative_why is not None,
            "indicative_why": self.indicative_why,
            "io_calls": self.io_calls,
            "bare_io_calls": self.bare_io_calls,
            "io_delay_ms": IO_DELAY_MS,
            "redelivery_calls": self.redelivery_calls,
            "latency_turns": self.latency_turns,
            "fanin_turns": self.fanin_turns,
            "roundtrip_calls": self.roundtrip_calls,
        }
