"""The sweeper at its seams, with real worker processes: a backlog (a job waiting in the queue
is not a lost one), a worker killed between a write's commit and the dispatch of the turn's
next write, and a live-but-slow worker whose taken calls a sweeper recovers meanwhile."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, text

from callgate.daemons import sweeper
from callgate.ops.stack import wait_for_workers
from callgate.queue import deliveries, transport
from callgate.store import db
from tests.acceptance.conftest import (
    REFUND_O17,
    SUPPORT_A,
    effects_for,
    handler_runs,
    scalar,
    trace_events,
    wait_until,
)
from tests.acceptance.private_stack import (
    database_url,
    dispatches,
    env,
    key_of,
    make_producer,
    start,
)
from tests.acceptance.processes import PrivateRedis, private_redis
from tests.faults.redisproxy import RedisProxy

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures


def _runs(engine: Engine, ref: str) -> int:
    return handler_runs(engine, ref)


def _code(result: Any) -> str | None:
    error = getattr(result, "error", None)
    return None if error is None else str(error.code)


# --- item 4: a backlog alone never ends a call ------------------------------------------


def test_a_backlog_behind_one_slow_slot_ends_no_call_and_runs_each_once(
    start, make_producer, engine
):
    # One slot, 1.5 s reads, stale after 2 s, 3 dispatches: the last of 6 reads waits
    # ~7.5 s in the queue, longer than 3 stale periods. Nothing dies, no job is lost.
    start(
        workers=1,
        CALLGATE_WORKER_CONCURRENCY="1",
        CALLGATE_DEMO_DELAY_MS="get_stock=1500",
        CALLGATE_LEASE_SECONDS="5",
        CALLGATE_STALE_SECONDS="2",
        CALLGATE_MAX_DISPATCHES="3",
    )
    producer = make_producer()
    turn = producer.submit(
        [
            {"call_id": f"s{i}", "tool_name": "get_stock", "arguments": {"symbol": f"S{i}"}}
            for i in range(6)
        ],
        SUPPORT_A,
    )
    collected = producer.collect(turn.turn_id, timeout=60)
    assert collected.complete, f"calls did not end: {collected.pending}"
    outcomes = {r.call_id: (r.status, _code(r)) for r in collected.results}
    assert outcomes == {f"s{i}": ("succeeded", None) for i in range(6)}
    for call in turn.calls:
        assert _runs(engine, call.ref) == 1
        # A job seen waiting is not dispatched again: no duplicate piles up in the queue.
        assert dispatches(engine, call.ref) == 1


# --- item 7: the next write of a turn after its completing worker died -------------------


@pytest.fixture
def proxy(private_redis: PrivateRedis) -> Iterator[RedisProxy]:
    p = RedisProxy("127.0.0.1", private_redis.port)
    p.start()
    yield p
    p.stop()


def test_the_next_write_is_dispatched_within_seconds_when_the_completing_worker_dies(
    start, make_producer, engine, fresh_payments, proxy, env
):
    # The stale rule would wait 60 s.
    s = start(
        workers=0,
        CALLGATE_STALE_SECONDS="60",
        CALLGATE_LEASE_SECONDS="5",
        CALLGATE_DEMO_DELAY_MS="refund_payment=0:1500",
    )
    s.start(
        "worker-1",
        ["worker", "--name", f"proxied-{uuid.uuid4().hex[:8]}"],
        env={"CALLGATE_REDIS_URL": proxy.url(env["CALLGATE_REDIS_URL"])},
    )
    wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], 1)
    producer = make_producer()
    turn = producer.submit(
        [
            {"call_id": "refund", "tool_name": "refund_payment", "arguments": REFUND_O17},
            {
                "call_id": "mail",
                "tool_name": "send_email",
                "arguments": {"to": "a@b.c", "template": "t"},
            },
        ],
        SUPPORT_A,
    )
    refund, mail = turn.calls
    wait_until(
        lambda: trace_events(engine, refund.ref, "reserved"),
        timeout=60,
        what="the refund to start",
    )
    proxy.freeze()  # from now on nothing worker-1 sends reaches Redis
    wait_until(
        lambda: (
            scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=refund.ref)
            == "succeeded"
        ),
        timeout=60,
        what="the refund's completion to commit",
    )
    # The commit is in; the enqueue of the e-mail cannot have reached Redis.
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    assert dispatches(engine, mail.ref) == 1  # marked by the completion, never enqueued
    s.start("worker-2", ["worker", "--name", f"direct-{uuid.uuid4().hex[:8]}"])

    collected = producer.collect(turn.turn_id, timeout=90)
    assert collected.complete, f"calls did not end: {collected.pending}"
    # On Postgres' clock: the sweeper dispatched the e-mail again a grace period after the
    # refund ended (5 s by default), well before the stale rule (60 s) would have.
    waited = scalar(
        engine,
        "SELECT extract(epoch FROM c.dispatched_at - p.completed_at)"
        " FROM callgate.calls c JOIN callgate.calls p ON p.id = c.after_call WHERE c.id = :r",
        r=mail.ref,
    )
    assert float(waited) < 30, f"the e-mail was dispatched again {waited} s after the refund"
    assert {r.call_id: r.status for r in collected.results} == {
        "refund": "succeeded",
        "mail": "succeeded",
    }
    assert effects_for(engine, key_of(engine, refund.operation_id)) == 1
    assert _runs(engine, mail.ref) == 1
    assert dispatches(engine, mail.ref) == 2


# --- item 8: a live-but-slow worker's new taken calls survive a recovery -----------------


def _taken_refs(conn: redis.Redis, queue: str, worker: str) -> set[str]:
    taken: dict[bytes, bytes] = conn.hgetall(deliveries.taken_key(queue, worker))  # type: ignore[assignment]
    return {str(deliveries.call_ref(v)) for v in taken.values()}


def test_a_recovery_does_not_wipe_calls_a_slow_worker_took_after_it_read_them(
    start, make_producer, engine, env, queue_name
):
    s = start(
        workers=1,
        relayer=False,
        sweeper=False,
        CALLGATE_WORKER_SWEEP="0",
        CALLGATE_WORKER_CONCURRENCY="2",
        CALLGATE_LEASE_SECONDS="30",
        CALLGATE_DEMO_DELAY_MS="get_stock=6000",
    )
    conn = redis.Redis.from_url(env["CALLGATE_REDIS_URL"])
    (raw,) = conn.smembers(deliveries.workers_key(queue_name))  # type: ignore[misc]
    worker = raw.decode()
    producer = make_producer()
    first = producer.submit(
        [{"call_id": "a", "tool_name": "get_stock", "arguments": {"symbol": "A"}}], SUPPORT_A
    )
    (a,) = first.calls
    wait_until(lambda: _taken_refs(conn, queue_name, worker) == {a.ref}, what="call a taken")
    s.signal("worker-1", signal.SIGSTOP)  # alive, but stops beating
    second = producer.submit(
        [{"call_id": "b", "tool_name": "get_stock", "arguments": {"symbol": "B"}}], SUPPORT_A
    )
    (b,) = second.calls
    wait_until(
        lambda: not conn.exists(deliveries.liveness_key(queue_name, worker)),
        timeout=15,
        what="the worker's liveness key to expire",
    )
    assert _taken_refs(conn, queue_name, worker) == {a.ref}

    recovered: list[Any] = []
    queue = transport.job_queue(conn, queue_name)
    sweeper_engine = db.create(env["CALLGATE_DATABASE_URL"])
    with engine.connect() as holder:
        # A lock really held by another connection keeps the recovery between its read of
        # the taken hash and its end, while the worker wakes up and takes call b.
        holder.execute(text("LOCK TABLE callgate.calls IN EXCLUSIVE MODE"))
        t = threading.Thread(
            target=lambda: recovered.append(
                sweeper.recover_lost(sweeper_engine, queue, job_timeout=60, max_dispatches=10)
            )
        )
        t.start()
        wait_until(
            lambda: scalar(
                engine,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND query LIKE '%SKIP LOCKED%'",
            ),
            what="the recovery to wait on the lock",
        )
        s.signal("worker-1", signal.SIGCONT)
        wait_until(
            lambda: b.ref in _taken_refs(conn, queue_name, worker), what="the worker to take b"
        )
        holder.rollback()
    t.join(timeout=30)
    sweeper_engine.dispose()
    # a is a read: no lease speaks for it, so the worker that stopped beating loses it at
    # once (a second run may follow; only one result is committed).
    assert recovered == [[uuid.UUID(a.ref)]]
    # b is in flight on a live worker: its record must still be there.
    assert b.ref in _taken_refs(conn, queue_name, worker)
