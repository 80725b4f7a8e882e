"""``callgate bench costs --statements`` as a user runs it: a private PostgreSQL with
pg_stat_statements, real workers and relayer, the shared Redis.

Asserts that the figures count real effects (each call's rows, its one ending, WAL that
pg_stat_wal saw too) and that the private server is gone afterwards: its processes and its
folder. Never how fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.services

CALLS = 2000
# The private server's folder (callgate.ops.lab.replicated makes it).
PREFIX = "callgate-pgrepl-"


def _servers() -> set[int]:
    """Processes whose command line names a private server's folder."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if PREFIX.encode() in cmdline:
            found.add(int(proc.name))
    return found


def _folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob(f"{PREFIX}*"))


@pytest.mark.timeout(240)
def test_statements_are_counted_per_call_on_a_private_server(
    redis_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "costs.json"
    servers, folders = _servers(), _folders()
    env = {**os.environ, "CALLGATE_REDIS_URL": redis_url}
    env.pop("CALLGATE_DATABASE_URL", None)  # the private server is the only one it uses
    argv = [sys.executable, "-m", "callgate", "bench", "costs", "--statements"]
    argv += ["--kind", "reads", "--calls", str(CALLS), "--workers", "1", "--out", str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| run | callgate | `endings.END_READS` |" in done.stdout

    # Stopped and removed: no process of it left, no folder.
    assert _servers() - servers == set()
    assert _folders() - folders == set()

    reads = json.loads(out.read_text())["kinds"]["reads"]
    found = reads["statements"]
    run = found["phases"]["run"]
    assert 0 < run["calls"] <= CALLS
    ending = [r for r in run["statements"] if r["statement"] == "endings.END_READS"]
    assert len(ending) == 1 and ending[0]["who"] == "callgate"
    # At most one ending a call: reads finishing together end in one statement.
    assert 0 < ending[0]["executions"] <= 1
    assert ending[0]["wal_bytes"] > 0 and ending[0]["mean_exec_ms"] > 0
    # The submit inserts each call once; no reservation on a read's path.
    submit = {r["statement"]: r for r in found["phases"]["submit"]["statements"]}
    assert submit["turns.INSERT_CALLS"]["rows"] == pytest.approx(1.0, abs=0.001)
    assert not any(r["statement"].startswith("reservations.RESERVE") for r in run["statements"])
    # Each call is one row of calls and outbox, inserted once and updated once (ended,
    # published), whatever the start-up wrote besides.
    for table in ("callgate.calls", "callgate.outbox"):
        t = found["tables"][table]
        assert t["inserted"] == pytest.approx(1.0, abs=0.001), table
        assert t["updated"] == pytest.approx(1.0, abs=0.01), table
        assert t["index_entries"] >= t["inserted"], table
    assert found["tables"]["callgate.calls"]["partial_indexes"]  # calls_open, at least
    # The demo tools write nothing for a read.
    assert "downstream" not in found["written_per_call"]
    assert found["written_per_call"]["callgate"]["rows"] >= 4
    # The statements' WAL is most of what the server wrote, never more than it.
    check = found["wal_check"]
    assert check["statements_wal_bytes_per_call"] > 0
    assert (
        0.5 * check["pg_stat_wal_bytes_per_call"]
        <= check["statements_wal_bytes_per_call"]
        <= check["pg_stat_wal_bytes_per_call"] * 1.01
    )
    assert check["wal_position_bytes_per_call"] >= check["statements_wal_bytes_per_call"]
    # The CPU figures of the same run are there too.
    assert reads["pg_cpu_ms_per_call"] > 0
