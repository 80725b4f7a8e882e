"""Redis restarted under many sweeping processes: each restart (Redis SIGKILLed and started
again on the same port, without persistence: its queue is gone) costs each open call one
dispatch, not one per sweeping process, and a process that starts after a restart still
notices it. Real processes on a private redis-server; dispatches counted in Postgres, jobs on
the queue, charges downstream."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import redis as redis_lib
from sqlalchemy import Engine

from callgate.ops.stack import Stack
from callgate.producer import Producer
from callgate.queue import deliveries
from callgate.store import db
from tests.acceptance.conftest import SUPPORT_A, scalar, wait_until
from tests.acceptance.private_stack import database_url, env, make_producer, start
from tests.acceptance.processes import PrivateRedis, private_redis

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures

SWEEPERS = 4
CALLS = 12
# Long enough that only the epoch rule, not the stale rule, brings lost calls back.
QUIET = {"CALLGATE_STALE_SECONDS": "300"}


def _submit(producer: Producer) -> list[tuple[str, str]]:
    """CALLS unkeyed charges, one turn each (a turn's writes run one after another)."""
    made = []
    for i in range(CALLS):
        turn = producer.submit(
            [{"call_id": f"c{i}", "tool_name": "charge_legacy", "arguments": {"amount": 1}}],
            {**SUPPORT_A, "request_id": f"r-{uuid.uuid4().hex[:8]}"},
        )
        (call,) = turn.calls
        made.append((turn.turn_id, call.ref))
    return made


def _dispatches(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT dispatches FROM callgate.calls ORDER BY id").all()
    return [r[0] for r in rows]


def _recorded_epoch(engine: Engine, queue: str) -> str | None:
    value = scalar(engine, "SELECT epoch FROM callgate.redis_epochs WHERE queue = :q", q=queue)
    return None if value is None else str(value)


def _redis_epoch(url: str, queue: str) -> str | None:
    conn = redis_lib.Redis.from_url(url)
    try:
        key = conn.get(deliveries.epoch_key(queue))
        replid = conn.info("replication").get("master_replid", "")
    finally:
        conn.close()
    return None if key is None else f"{key.decode()}@{replid}"


def _restart(server: PrivateRedis) -> None:
    server.kill()
    server.start()


def test_restarts_cost_each_open_call_one_dispatch_however_many_processes_sweep(
    start: Callable[..., Stack],
    make_producer: Callable[..., Producer],
    private_redis: PrivateRedis,
    env: dict[str, str],
) -> None:
    queue = env["CALLGATE_QUEUE"]
    engine = db.create(env["CALLGATE_DATABASE_URL"])
    s = start(workers=0, relayer=True, sweeper=False, **QUIET)
    for i in range(SWEEPERS):
        s.start(f"sweeper-{i}", ["sweeper"], env=QUIET)
    producer = make_producer()
    calls = _submit(producer)

    def settled() -> bool:
        # The sweepers recorded what Redis holds now, and every call is queued once.
        now = _redis_epoch(private_redis.url, queue)
        return now is not None and _recorded_epoch(engine, queue) == now

    wait_until(settled, what="the sweepers recorded Redis's epoch")
    assert _dispatches(engine) == [1] * CALLS

    queued = redis_lib.Redis.from_url(private_redis.url)
    for restart in (1, 2, 3):
        _restart(private_redis)
        queued.close()
        queued = redis_lib.Redis.from_url(private_redis.url)
        wait_until(settled, timeout=30, what=f"restart {restart} recorded")
        wait_until(
            lambda q=queued: q.llen(f"rq:queue:{queue}") >= CALLS,
            timeout=30,
            what=f"the calls queued again after restart {restart}",
        )
        # Several sweeps of every process later, nothing more was dispatched.
        time.sleep(1.5)
        assert _dispatches(engine) == [1 + restart] * CALLS, restart
        assert queued.llen(f"rq:queue:{queue}") == CALLS, restart

    # A sweeping process that starts now settles the same epoch and dispatches nothing.
    s.start("sweeper-late", ["sweeper"], env=QUIET)
    time.sleep(1.5)
    assert _dispatches(engine) == [4] * CALLS

    # The calls then run once each: CALLS charges downstream, every turn ends succeeded.
    s.start_worker("worker-1")
    for turn_id, _ref in calls:
        collected = producer.collect(turn_id, timeout=30)
        assert collected.complete, collected.pending
        (result,) = collected.results
        assert result.status == "succeeded", result
    charged = scalar(
        engine, "SELECT count(*) FROM downstream.side_effects WHERE service = 'legacy'"
    )
    assert charged == CALLS
    queued.close()
    engine.dispose()
