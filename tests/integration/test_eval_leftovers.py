"""An eval run stopped part-way leaves nothing behind: ``callgate eval run`` as a real process
on the session's PostgreSQL and Redis, stopped by a real signal once its workers, relayer
and sweeper are running.

SIGTERM and SIGHUP unwind the run: its processes are stopped, its scratch database dropped,
its queue's keys and its entry in RQ's set of queues removed. SIGKILL cannot be handled: its
processes end with it all the same (they asked the kernel for SIGTERM on their parent's
death), and what it left on the services is removed by a later run once it is old enough
(the test moves the clock instead of waiting).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import redis

from callgate.ops.lab.eval import leftovers
from callgate.store import db

ADMIN_URL = os.environ.get("CALLGATE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _databases(prefix: str) -> set[str]:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix]
        )
        return {r[0] for r in rows}


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _queue_keys(connection: redis.Redis, queue: str) -> list[bytes]:
    keys = [
        *connection.scan_iter(match=f"callgate:{queue}:*"),
        *connection.scan_iter(f"rq:*:{queue}"),
    ]
    if connection.sismember("rq:queues", f"rq:queue:{queue}"):
        keys.append(b"rq:queues")
    return keys


def _started(
    tmp_path: Path, database_url: str, redis_url: str, prefix: str
) -> tuple[subprocess.Popen[str], str, set[int]]:
    """A run of the built-in suite, once its scratch database exists, its three processes
    (worker, relayer, sweeper) run and its first calls are enqueued; its token (the
    database's and the queue's name)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    environ.update(
        CALLGATE_DATABASE_URL=database_url,
        CALLGATE_REDIS_URL=redis_url,
        CALLGATE_EVAL_SCRATCH_PREFIX=prefix,
    )
    command = [sys.executable, "-m", "callgate", "eval", "run", "builtin", "--workers", "1"]
    run = subprocess.Popen(
        [*command, "--out", str(tmp_path / "out")],
        cwd=Path(__file__).resolve().parents[2],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    connection = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names, children = _databases(prefix), _children(run.pid)
        if names and len(children) >= 3:
            (name,) = names
            token = name.removeprefix(prefix)
            # Calls are on their way: RQ has registered the queue.
            if connection.sismember("rq:queues", f"rq:queue:{leftovers.QUEUE_PREFIX}{token}"):
                return run, token, children
        assert run.poll() is None, run.communicate()[1][-2000:]
        time.sleep(0.05)
    run.kill()
    raise AssertionError("the run did not start its processes within 60 s")


def _gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return {p for p in pids if _alive(p)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_eval_run_removes_what_it_made(
    tmp_path: Path, database_url: str, redis_url: str, sig: signal.Signals
) -> None:
    prefix = f"cg_left_{uuid.uuid4().hex[:6]}_"
    run, token, children = _started(tmp_path, database_url, redis_url, prefix)
    run.send_signal(sig)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert _gone(children, 10) == set()
    assert _databases(prefix) == set()
    connection = redis.Redis.from_url(redis_url)
    assert _queue_keys(connection, f"{leftovers.QUEUE_PREFIX}{token}") == []


@pytest.mark.timeout(180)
def test_a_killed_eval_run_takes_its_processes_and_a_later_run_removes_the_rest(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    prefix = f"cg_left_{uuid.uuid4().hex[:6]}_"
    run, token, children = _started(tmp_path, database_url, redis_url, prefix)
    queue = f"{leftovers.QUEUE_PREFIX}{token}"
    connection = redis.Redis.from_url(redis_url)
    run.kill()
    run.communicate(timeout=30)
    assert _gone(children, 15) == set()  # SIGTERM from the kernel, handled as a stop
    assert _databases(prefix) == {f"{prefix}{token}"}  # nobody was left to drop it

    # A later run: what is younger than the settling time, or in use, is kept.
    admin = db.create(ADMIN_URL, pool_size=1, application_name="test-leftovers")
    try:
        assert leftovers.drop_stale_databases(admin, prefix) == []
        later = time.time() + leftovers.SETTLE_SECONDS + 1
        with psycopg.connect(database_url.rsplit("/", 1)[0] + f"/{prefix}{token}"):
            assert leftovers.drop_stale_databases(admin, prefix, now=later) == []
        assert leftovers.drop_stale_databases(admin, prefix, now=later) == [f"{prefix}{token}"]
    finally:
        admin.dispose()
    assert _databases(prefix) == set()
    assert _queue_keys(connection, queue) != []  # the killed run's
    assert queue not in leftovers.forget_stale_queues(connection)  # too young yet
    assert queue in leftovers.forget_stale_queues(connection, now=later)
    assert _queue_keys(connection, queue) == []


def test_only_names_of_the_prefix_with_a_time_are_ever_stale() -> None:
    now = 1_800_000_000.0
    old = leftovers.token(now - leftovers.SETTLE_SECONDS - 5)
    young = leftovers.token(now - 5)
    assert leftovers.stale(f"callgate_eval_{old}", "callgate_eval_", now)
    assert not leftovers.stale(f"callgate_eval_{young}", "callgate_eval_", now)
    assert not leftovers.stale(f"other_{old}", "callgate_eval_", now)
    assert not leftovers.stale("callgate_eval_0123456789ab", "callgate_eval_", now)  # no time
    assert not leftovers.stale(f"callgate_eval_{old}x", "callgate_eval_", now)
