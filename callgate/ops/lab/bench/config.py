"""What one ``callgate bench`` run measures, and how much of it."""

from __future__ import annotations

from dataclasses import dataclass

QUICK = {"workers": (1, 2), "calls": 60, "repeat": 1}
FULL = {"workers": (1, 2, 4), "calls": 1000, "repeat": 3}
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
    def io_calls(self) -> int:
        """100 ms tools: enough calls to keep every worker busy for a few seconds at one
        call in flight per process, without making the run take minutes."""
        return min(self.calls, 20 if self.quick else 320)

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
            "io_calls": self.io_calls,
            "io_delay_ms": IO_DELAY_MS,
            "redelivery_calls": self.redelivery_calls,
            "latency_turns": self.latency_turns,
            "fanin_turns": self.fanin_turns,
            "roundtrip_calls": self.roundtrip_calls,
        }
