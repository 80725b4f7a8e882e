"""A sweep tells a backlog from a loss by asking Redis where each due call's job is. Real
Redis and Postgres: calls are made due by their own settings (a stale period of 0.1 s),
jobs are taken with the worker's own take script or deleted as Redis loses them, and what
the sweep did is counted on the queue and in Postgres."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from rq.job import Job
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.core.types import Turn
from callgate.daemons import sweeper
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer import Producer
from callgate.queue import deliveries, transport
from callgate.store import db

CONTEXT = {"request_id": "r", "tenant_id": "tenant-a", "user_id": "user-17", "roles": ["support"]}
STALE = 0.1


@pytest.fixture
def own_url(make_own_database: Callable[[], str]) -> str:
    return make_own_database()


@pytest.fixture
def engine(own_url: str) -> Iterator[Engine]:
    e = db.create(own_url)
    yield e
    e.dispose()


@pytest.fixture
def producer(own_url: str, redis_url: str, queue_name: str) -> Iterator[Producer]:
    env = {"CALLGATE_DATABASE_URL": own_url, "CALLGATE_REDIS_URL": redis_url}
    p = Producer(
        settings=Settings.from_env({**env, "CALLGATE_QUEUE": queue_name}),
        engine=db.create(own_url),
        redis_connection=transport.connect(redis_url),
        registry=demo_registry(),
    )
    yield p
    p.close()


def _reads(producer: Producer, n: int) -> list[uuid.UUID]:
    turn: Turn = producer.submit(
        [
            {"call_id": f"c{i}", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}}
            for i in range(n)
        ],
        {**CONTEXT, "request_id": f"r-{uuid.uuid4().hex[:6]}"},
    )
    return [uuid.UUID(c.ref) for c in turn.calls]


def _sweep(engine: Engine, producer: Producer, max_dispatches: int = 3) -> sweeper.Sweep:
    time.sleep(STALE * 2)  # every call is past its stale period
    return sweeper.sweep_once(
        engine, producer.queue, stale_seconds=STALE, job_timeout=60, max_dispatches=max_dispatches
    )


def _rows(engine: Engine, refs: list[uuid.UUID]) -> list[tuple[str, int, bool]]:
    with engine.connect() as conn:
        return [
            tuple(
                conn.execute(
                    text(
                        "SELECT state, dispatches, queued_seen_at IS NOT NULL"
                        " FROM callgate.calls WHERE id = :r"
                    ),
                    {"r": r},
                ).one()
            )
            for r in refs
        ]


def test_a_waiting_job_is_never_dispatched_again_nor_counted_nor_ended(
    engine: Engine, producer: Producer
) -> None:
    refs = _reads(producer, 3)
    for _ in range(5):  # more sweeps than the budget of 3 dispatches
        done = _sweep(engine, producer)
        assert (done.dispatched, done.ended) == ([], [])
        with engine.begin() as conn:  # seen queued long ago: due again at every sweep
            conn.execute(text("UPDATE callgate.calls SET queued_seen_at = now() - interval '1h'"))
    assert _rows(engine, refs) == [("proposed", 1, True)] * 3
    assert producer.queue.count == 3  # no duplicate piled up


def test_a_job_redis_lost_is_dispatched_again_and_counted_until_the_budget(
    engine: Engine, producer: Producer
) -> None:
    (ref,) = _reads(producer, 1)
    conn: redis.Redis = producer.queue.connection
    for dispatched in (2, 3):
        conn.delete(Job.redis_job_namespace_prefix + transport.job_id(ref))  # the job is lost
        assert _sweep(engine, producer).dispatched == [ref]
        assert _rows(engine, [ref]) == [("proposed", dispatched, False)]
    conn.delete(Job.redis_job_namespace_prefix + transport.job_id(ref))
    assert _sweep(engine, producer).ended == [ref]
    assert _rows(engine, [ref])[0][:2] == ("failed_terminal", 3)


def test_a_job_a_live_worker_holds_is_waiting_and_a_dead_ones_is_lost(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    live, dead = _reads(producer, 2)
    conn: redis.Redis = producer.queue.connection
    keys = [producer.queue.key, "", ""]
    for worker in ("live", "dead"):
        keys[1:] = [
            deliveries.taking_key(queue_name, worker),
            deliveries.taken_key(queue_name, worker),
        ]
        conn.register_script(deliveries.TAKE_LUA)(
            keys=keys, args=[1, Job.redis_job_namespace_prefix]
        )
        conn.sadd(deliveries.workers_key(queue_name), worker)
    conn.set(deliveries.liveness_key(queue_name, "live"), "1", ex=60)
    assert deliveries.job_states(producer.queue, [live, dead]) == {live: "taken", dead: "absent"}
    assert _sweep(engine, producer).dispatched == [dead]
    assert [r[1] for r in _rows(engine, [live, dead])] == [1, 2]


def test_a_job_whose_queue_entry_redis_lost_is_dispatched_again(
    engine: Engine, producer: Producer
) -> None:
    """The job's hash outlived its entry in the queue (a partial loss: an evicted or
    deleted queue key, one entry removed): nothing would ever take it, so it is lost, not
    waiting. One of three loses its entry; the other two still wait and are left alone."""
    lost, *waiting = _reads(producer, 3)
    conn: redis.Redis = producer.queue.connection
    assert conn.lrem(producer.queue.key, 0, transport.job_id(lost)) == 1
    assert conn.exists(Job.redis_job_namespace_prefix + transport.job_id(lost)) == 1
    assert deliveries.job_states(producer.queue, [lost, *waiting]) == {
        lost: "absent",
        **{w: "queued" for w in waiting},
    }
    assert _sweep(engine, producer).dispatched == [lost]
    assert [r[1] for r in _rows(engine, [lost, *waiting])] == [2, 1, 1]
    conn.delete(producer.queue.key)  # the whole queue key lost: every call is due again
    assert sorted(_sweep(engine, producer).dispatched) == sorted([lost, *waiting])
