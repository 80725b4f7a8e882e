"""Measure run_python's sandbox: start-up overhead per run against a plain interpreter
subprocess, and how many runs one worker's sandboxes sustain at once; or, with ``inodes``,
the kernel memory a run's empty files hold (not bounded by the tmpfs sizes). Not a test; run
by hand (it prints numbers, it checks nothing):

    python -m callgate.ops.lab.bench.micro.sandbox_overhead [runs]
    python -m callgate.ops.lab.bench.micro.sandbox_overhead inodes
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from callgate.tools.registry import ExecutionContext
from callgate.worker.sandbox import Limits, python_tool
from callgate.worker.sandbox.tool import RunPython

CTX = ExecutionContext("t", "u", "op", "key", 1, "req")


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]
    return f"p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


def start_up(runs: int) -> None:
    """``pass`` in a sandbox against ``pass`` in a plain interpreter subprocess, alternated."""
    tool = python_tool(limits=Limits(wall_seconds=30))
    sandboxed: list[float] = []
    plain: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        tool.handler(RunPython(code="pass"), CTX)
        sandboxed.append(time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", "pass"], check=True)
        plain.append(time.perf_counter() - started)
    print(f"{runs} runs of `pass`: sandboxed {percentiles(sandboxed)}")
    print(f"{runs} runs of `pass`: plain python3 -I -S -c pass {percentiles(plain)}")


def at_once(concurrency: int) -> None:
    """``concurrency`` threads (a worker's calls), each running eight short snippets."""
    tool = python_tool(limits=Limits(wall_seconds=30), max_concurrent=concurrency)
    code = RunPython(code="sum(i * i for i in range(200_000))")
    total = concurrency * 8
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda _: tool.handler(code, CTX), range(total)))
    elapsed = time.perf_counter() - started
    ok = sum(1 for r in results if r["exit_code"] == 0)
    print(
        f"{concurrency} at once: {total} runs ({ok} ok) in {elapsed:.2f} s, "
        f"{total / elapsed:.1f} runs/s"
    )


# Empty files in /tmp for 5 s of CPU, and the growth of the machine's kernel slab (read from
# inside: /proc/meminfo is the host's).
INODES = """
import os, time
def slab():
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('Slab:'):
                return int(line.split()[1]) * 1024
before, n = slab(), 0
try:
    while time.process_time() < 5:
        for _ in range(1000):
            os.close(os.open(f'/tmp/f{n}', os.O_CREAT | os.O_WRONLY))
            n += 1
except OSError as exc:
    print('stopped:', exc)
print(n, time.process_time(), slab() - before)
"""


def inodes() -> None:
    tool = python_tool(limits=Limits(wall_seconds=30, cpu_seconds=20))
    files, cpu, grown = tool.handler(RunPython(code=INODES), CTX)["stdout"].split()[-3:]
    n, seconds, slab = int(files), float(cpu), int(grown)
    print(
        f"{n} empty files in {seconds:.1f} s of CPU ({n / seconds:.0f} a second); "
        f"kernel slab +{slab >> 20} MiB ({slab / n:.0f} bytes a file)"
    )


def main() -> None:
    if sys.argv[1:] == ["inodes"]:
        inodes()
        return
    start_up(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
    for concurrency in (1, 2, 4, 8, 16, 32, 64):
        at_once(concurrency)


if __name__ == "__main__":
    main()
