"""``callgate bench``: callgate against bare RQ, on the real Postgres and Redis.

Every figure is a ratio against a baseline measured in the same run, interleaved, median of
the repeats; throughput comes from the systems' own timestamps (Postgres for callgate, RQ's
job timestamps for bare RQ), never from the bench's clock. Correctness checks inside it
(every call ended, one side effect per redelivered write) fail the bench when they do not
hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from callgate.core.settings import Settings
from callgate.ops.lab.bench import report
from callgate.ops.lab.bench.config import Config
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.runner import Bench
from callgate.ops.lab.bench.services import Services

__all__ = ["BenchError", "Config", "run"]


def run(
    settings: Settings, config: Config, out: Path, command: str
) -> tuple[dict[str, Any], list[Path]]:
    """Run the bench, write its files to ``out``; returns the results and the files."""
    services = Services.prepare(settings)
    result = Bench(config, services).run()
    return result, report.write(out, result, command)
