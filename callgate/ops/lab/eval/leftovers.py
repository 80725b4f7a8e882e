"""What an eval run leaves on configured services, named so a later run can tell it apart,
and removed by that run when its owner is gone.

A run's scratch database is ``<prefix><created><random>`` and its queue
``eval-<created><random>``, ``created`` the start time in seconds as 8 hex digits. A run that
ends, or is stopped by SIGTERM or SIGHUP, removes both itself. One killed by SIGKILL cannot:
its workers, relayer and sweeper end with it (they are told by the kernel, see
``callgate.ops.lifeline``), and the next run removes a database of the prefix that is older
than ``SETTLE_SECONDS`` and that nobody is connected to, and the keys of a queue that old with
no live worker registered.
"""

from __future__ import annotations

import re
import secrets
import time

import redis
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

QUEUE_PREFIX = "eval-"
# A run connects to its database, and its workers register, within this long of being named.
SETTLE_SECONDS = 120.0
_TOKEN = r"([0-9a-f]{8})[0-9a-f]{8}"


def token(now: float | None = None) -> str:
    return f"{int(now if now is not None else time.time()):08x}{secrets.token_hex(4)}"


def created(name: str, prefix: str) -> float | None:
    """When the run that named ``name`` (``prefix`` + a token) started; None for any other
    name, an older run's among them (they carry no time: never removed)."""
    found = re.fullmatch(re.escape(prefix) + _TOKEN, name)
    return float(int(found.group(1), 16)) if found else None


def stale(name: str, prefix: str, now: float) -> bool:
    started = created(name, prefix)
    return started is not None and now - started > SETTLE_SECONDS


def drop_stale_databases(admin: Engine, prefix: str, now: float | None = None) -> list[str]:
    """Drop the prefix's databases old enough and unused; the names dropped. A database
    someone is connected to (a run still going) refuses the plain ``DROP`` and is kept."""
    at = now if now is not None else time.time()
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        names = conn.execute(
            text("SELECT datname FROM pg_database WHERE starts_with(datname, :prefix)"),
            {"prefix": prefix},
        ).scalars()
        dropped = []
        for name in [n for n in names if stale(n, prefix, at)]:
            try:
                conn.execute(text(f'DROP DATABASE "{name}"'))
            except DBAPIError:
                continue  # in use (or not ours to drop): left alone
            dropped.append(name)
    return dropped


def forget_queue(connection: redis.Redis, queue: str) -> None:
    """Every key of ``queue`` (its name is a run's own), and its entry in RQ's set of queues."""
    for pattern in (f"callgate:{queue}:*", f"rq:*:{queue}"):
        for key in connection.scan_iter(match=pattern, count=500):
            connection.delete(key)
    connection.srem("rq:queues", f"rq:queue:{queue}")


def forget_stale_queues(connection: redis.Redis, now: float | None = None) -> list[str]:
    """Forget eval queues old enough that no live worker serves; the names forgotten."""
    at = now if now is not None else time.time()
    forgotten = []
    for queue in sorted(_eval_queues(connection)):
        if stale(queue, QUEUE_PREFIX, at) and not _served(connection, queue):
            forget_queue(connection, queue)
            forgotten.append(queue)
    return forgotten


def _eval_queues(connection: redis.Redis) -> set[str]:
    """Eval queues with keys: RQ's set of queues, callgate's keys and RQ's per-queue keys."""
    names = {_text(m).removeprefix("rq:queue:") for m in connection.smembers("rq:queues")}
    for key in connection.scan_iter(match=f"callgate:{QUEUE_PREFIX}*", count=1000):
        names.add(_text(key).split(":")[1])
    for key in connection.scan_iter(match=f"rq:*:{QUEUE_PREFIX}*", count=1000):
        names.add(_text(key).rsplit(":", 1)[1])
    return {n for n in names if n.startswith(QUEUE_PREFIX)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _served(connection: redis.Redis, queue: str) -> bool:
    """A worker of ``queue`` is registered and its key (kept alive by its heartbeat) exists."""
    workers = connection.smembers(f"rq:workers:{queue}")
    return any(connection.exists(w) for w in workers)
