"""The registry the sandbox's escape suite runs through real workers: ``run_python`` with
small limits, and one CSV attached from ``SANDBOX_TEST_CSV`` (a path the test writes).
``plot_python`` is the same tool with CPU enough for matplotlib: importing it and drawing
one figure takes 0.6–1.1 s of CPU on its own, as much as ``run_python``'s whole limit.

Workers load it with ``CALLGATE_TOOLS=tests.acceptance.sandbox_tools:registry``."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from callgate.tools.registry import Registry
from callgate.worker.sandbox import Limits, python_tool

MiB = 1 << 20
LIMITS = Limits(
    wall_seconds=2.0,
    cpu_seconds=1,
    memory_bytes=256 * MiB,
    max_processes=16,
    max_file_bytes=4 * MiB,
    max_open_files=32,
    scratch_bytes=16 * MiB,
    output_bytes=16 * 1024,
    output_files=4,
    output_file_bytes=2 * MiB,
)
PLOT_LIMITS = replace(LIMITS, wall_seconds=20.0, cpu_seconds=10)


def registry() -> Registry:
    csv = os.environ.get("SANDBOX_TEST_CSV")
    inputs = {"sales.csv": Path(csv)} if csv else None
    tool = python_tool(limits=LIMITS, inputs=inputs, max_concurrent=2)
    plot = python_tool(name="plot_python", limits=PLOT_LIMITS, inputs=inputs, max_concurrent=1)
    return Registry.of([tool, plot], {"analyst": ["run_python", "plot_python"]})
