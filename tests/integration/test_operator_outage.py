"""An operator command that cannot reach PostgreSQL for longer than its reconnect window
(10 s) gives up with an error that says its outcome may be recorded and that running it
again is safe, never one that reads as "nothing happened": a lost reply on its last attempt
cannot be told from a refused connect. Connections are really refused (the fault proxy stops
listening); the commands run as an operator runs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import pytest

from tests.faults.pgproxy import PgProxy

pytestmark = pytest.mark.timeout(120)


def test_operator_commands_that_give_up_say_the_outcome_may_be_recorded(
    make_own_database: Callable[[], str], pg_proxy: PgProxy
) -> None:
    env = {
        **os.environ,
        "CALLGATE_DATABASE_URL": pg_proxy.url(make_own_database()),
        "CALLGATE_REDIS_URL": "redis://127.0.0.1:1/0",  # never reached: nothing is decided
    }
    commands = {
        "approve": ["approvals", "approve", str(uuid.uuid4()), "--by", "a", "--tenant", "t"],
        "deny": ["approvals", "deny", str(uuid.uuid4()), "--by", "a", "--tenant", "t"],
        "resolve": ["reconcile", "resolve", "op-x", "--outcome", "failed", "--by", "a"],
        "prune": ["prune", "--older-than", "1d"],
    }
    # Longer than each command's start and its 10 s of reconnecting.
    pg_proxy.refuse_for(40)
    started = time.monotonic()
    running = {
        name: subprocess.Popen(
            [sys.executable, "-m", "callgate", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    said = {name: proc.communicate(timeout=90) for name, proc in running.items()}
    # Each kept reconnecting through its window before giving up (a lower bound: a loaded
    # machine only makes it longer).
    assert time.monotonic() - started >= 9.0
    codes = {name: proc.returncode for name, proc in running.items()}
    assert codes == dict.fromkeys(commands, 2), said
    for name, (_, err) in said.items():
        assert "Traceback" not in err, err
        assert err.startswith("callgate: database_unavailable: "), err
        what = "batches may have been removed" if name == "prune" else "may have been recorded"
        assert what in err and ("safe" in err or "run it again" in err), err
