"""The whole ``callgate bench``: prepare the services, run every step, write the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from callgate.core.settings import Settings
from callgate.ops.lab.bench import report
from callgate.ops.lab.bench.config import Config
from callgate.ops.lab.bench.runner import Bench
from callgate.ops.lab.bench.services import Services


def run(
    settings: Settings, config: Config, out: Path, command: str
) -> tuple[dict[str, Any], list[Path]]:
    """Run the bench, write its files to ``out``; returns the results and the files. Raises
    ``BenchError`` (``callgate.ops.lab.bench.procs``) when a result cannot be trusted."""
    services = Services.prepare(settings)
    result = Bench(config, services).run()
    return result, report.write(out, result, command)
