"""A worker's Redis round trips under real faults: an error reply from Redis (OOM, READONLY
after a failover) must not kill the liveness thread or the worker, a lost reply to the take
script must not strand the jobs it took, and ids of finished jobs must not be forgotten when
the script call that carries them fails."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_lib
from sqlalchemy import Engine

from callgate.ops.stack import wait_for_workers
from callgate.queue import deliveries
from tests.acceptance.conftest import (
    handler_runs,
    wait_until,
)
from tests.acceptance.private_stack import (
    database_url,
    env,
    make_producer,
    only_result,
    start,
    submit_one,
)
from tests.acceptance.processes import private_redis
from tests.faults.core import CUT, LOSE_REPLY
from tests.faults.redisproxy import RedisProxy, command_fault, script_fault

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures

TAKE_SHA = hashlib.sha1(deliveries.TAKE_LUA.encode()).hexdigest()
# EVALSHA sha 3 queue taking taken count prefix: more arguments are returned job ids.
TAKE_ARGS_WITHOUT_RETURNS = 8
# EVALSHA's arguments, joined by spaces, of a take that also returns job ids.
TAKE_WITH_RETURNS = rf"^{TAKE_SHA}( \S+){{{TAKE_ARGS_WITHOUT_RETURNS - 1}}}"


def _worker_name(r: redis_lib.Redis, queue: str) -> str:
    (name,) = wait_until(lambda: r.smembers(deliveries.workers_key(queue)), what="a worker")
    return str(name.decode())


def _reservations(engine: Engine, ref: str) -> int:
    """How many times the call's handler ran (a read takes no reservation; see
    ``handler_runs``)."""
    return handler_runs(engine, ref)


def _took(replies: bytes) -> bool:
    """A take's reply that carries jobs: a non-empty array (not NOSCRIPT, not ``*0``)."""
    return replies.startswith(b"*") and not replies.startswith(b"*0\r\n")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("fault", ["oom", "readonly"])
def test_the_worker_keeps_beating_through_redis_error_replies(
    fault: str, start, make_producer, engine, env, private_redis
) -> None:
    s = start(workers=1, sweeper=False)
    queue = env["CALLGATE_QUEUE"]
    admin = redis_lib.Redis.from_url(private_redis.url)
    name = _worker_name(admin, queue)
    alive = deliveries.liveness_key(queue, name)
    assert admin.exists(alive)

    if fault == "oom":  # every write that needs memory is refused with OOM
        admin.config_set("maxmemory", "1")
    else:  # a failover turned this server into a replica: every write is READONLY
        admin.execute_command("REPLICAOF", "127.0.0.1", str(_closed_port()))
    try:
        # Beats are refused until the key runs out (5 s TTL).
        wait_until(lambda: not admin.exists(alive), timeout=20, what="the liveness key to lapse")
    finally:
        if fault == "oom":
            admin.config_set("maxmemory", "0")
        else:
            admin.execute_command("REPLICAOF", "NO", "ONE")

    wait_until(lambda: admin.exists(alive), timeout=15, what="the worker to beat again")
    assert s.procs["worker-1"].poll() is None, "the worker died of an error reply"
    producer = make_producer()
    turn_id, _ref, _op = submit_one(producer, "get_stock", {"symbol": "AFTER"})
    assert only_result(producer, turn_id).status == "succeeded"


@pytest.fixture
def proxy(private_redis) -> Iterator[RedisProxy]:
    p = RedisProxy("127.0.0.1", private_redis.port)
    p.start()
    yield p
    p.stop()


def _worker_behind(s: Any, proxy: RedisProxy, env: dict[str, str]) -> None:
    """One worker whose every Redis round trip goes through ``proxy``; no sweeper anywhere, and
    a stale rule far away, so nothing but the worker itself can bring a stranded job back."""
    s.start(
        "worker-1",
        ["worker", "--name", f"w-{os.getpid()}-{time.monotonic_ns()}"],
        env={
            "CALLGATE_REDIS_URL": proxy.url(env["CALLGATE_REDIS_URL"]),
            "CALLGATE_WORKER_SWEEP": "0",
        },
    )
    wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], 1)


def test_a_lost_take_reply_strands_no_job(
    start, make_producer, engine, env, private_redis, proxy
) -> None:
    s = start(workers=0, sweeper=False, CALLGATE_STALE_SECONDS="600")
    _worker_behind(s, proxy, env)
    admin = redis_lib.Redis.from_url(private_redis.url)
    taken = deliveries.taken_key(env["CALLGATE_QUEUE"], _worker_name(admin, env["CALLGATE_QUEUE"]))
    # The first take that took a job runs on Redis; its reply never reaches the worker.
    lost = proxy.arm(
        script_fault(LOSE_REPLY, deliveries.TAKE_LUA, reply_matches=_took, label="take")
    )

    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "get_stock", {"symbol": "LOST"})
    wait_until(lambda: proxy.fired == [lost], what="the take's reply to be dropped")
    result = only_result(producer, turn_id, timeout=20)
    assert result.status == "succeeded"
    assert _reservations(engine, ref) == 1  # run once
    assert s.procs["worker-1"].poll() is None
    wait_until(lambda: admin.hlen(taken) == 0, timeout=10, what="the taken hash to empty")


def test_a_failed_take_forgets_no_returned_job(
    start, make_producer, engine, env, private_redis, proxy
) -> None:
    s = start(workers=0, sweeper=False, CALLGATE_STALE_SECONDS="600")
    _worker_behind(s, proxy, env)
    admin = redis_lib.Redis.from_url(private_redis.url)
    taken = deliveries.taken_key(env["CALLGATE_QUEUE"], _worker_name(admin, env["CALLGATE_QUEUE"]))
    # The first take that carries a finished job's id never reaches Redis.
    refused = proxy.arm(
        command_fault(CUT, "EVALSHA", args=TAKE_WITH_RETURNS, label="take with returns")
    )

    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "get_stock", {"symbol": "DONE"})
    assert only_result(producer, turn_id).status == "succeeded"
    wait_until(lambda: proxy.fired == [refused], what="a take carrying its id to be refused")
    # The id is sent again with a later take, and the finished job leaves the taken hash.
    wait_until(lambda: admin.hlen(taken) == 0, timeout=10, what="the taken hash to empty")
    assert _reservations(engine, ref) == 1
    assert s.procs["worker-1"].poll() is None
