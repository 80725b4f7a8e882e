"""A sweep brings back, without waiting for CALLGATE_STALE_SECONDS, the calls a dead worker
had taken and the jobs Redis lost; it leaves a reserved call to its lease. Real Redis and
Postgres: the worker's own take script moves the jobs, keys are deleted as Redis loses them,
and what comes back is counted on the queue and in Postgres."""

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
from callgate.store import db, reservations

CONTEXT = {
    "request_id": "r-lost",
    "tenant_id": "tenant-a",
    "user_id": "user-17",
    "roles": ["support"],
}
MAX = 10


@pytest.fixture
def own_url(make_own_database: Callable[[], str]) -> str:
    """A database of this test's own: a sweep over every open call sees only its calls."""
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


def _reads(producer: Producer, n: int) -> Turn:
    proposals = [
        {"call_id": f"c{i}", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}}
        for i in range(n)
    ]
    return producer.submit(proposals, {**CONTEXT, "request_id": f"r-{uuid.uuid4().hex[:6]}"})


def _take(conn: redis.Redis, queue: str, worker: str, count: int) -> list[bytes]:
    """What a worker's consumer does to take jobs (``TAKE_LUA``), as worker ``worker``."""
    keys = [
        f"rq:queue:{queue}",
        deliveries.taking_key(queue, worker),
        deliveries.taken_key(queue, worker),
    ]
    replies = conn.register_script(deliveries.TAKE_LUA)(
        keys=keys, args=[count, Job.redis_job_namespace_prefix]
    )
    conn.sadd(deliveries.workers_key(queue), worker)
    return list(replies[::2])


def _dispatches(engine: Engine, refs: list[uuid.UUID]) -> list[int]:
    with engine.connect() as conn:
        return [
            conn.execute(
                text("SELECT dispatches FROM callgate.calls WHERE id = :r"), {"r": r}
            ).scalar_one()
            for r in refs
        ]


def _recover(
    engine: Engine, producer: Producer, epoch: deliveries.RedisEpoch | None = None
) -> list[uuid.UUID]:
    return sweeper.recover_lost(
        engine, producer.queue, job_timeout=60, max_dispatches=MAX, epoch=epoch
    )


def test_a_dead_workers_taken_calls_come_back_and_a_live_ones_do_not(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    conn.set(deliveries.epoch_key(queue_name), "e")  # Redis has not lost anything
    turn = _reads(producer, 3)
    refs = [uuid.UUID(str(c.ref)) for c in turn.calls]
    assert len(_take(conn, queue_name, "alive", 1)) == 1
    assert len(_take(conn, queue_name, "dead", 2)) == 2
    conn.set(deliveries.liveness_key(queue_name, "alive"), "1", ex=30)
    assert producer.queue.count == 0
    # The stale rule would wait 60 s: nothing is due by it.
    assert (
        sweeper.sweep_once(
            engine, producer.queue, stale_seconds=60, job_timeout=60, max_dispatches=MAX
        ).dispatched
        == []
    )

    back = _recover(engine, producer)

    assert len(back) == 2 and set(back) <= set(refs)
    assert producer.queue.count == 2
    assert sorted(_dispatches(engine, refs)) == [1, 2, 2]
    assert conn.smembers(deliveries.workers_key(queue_name)) == {b"alive"}
    assert not conn.exists(deliveries.taken_key(queue_name, "dead"))
    assert _recover(engine, producer) == []  # once


def test_a_recovery_left_midway_is_made_by_another_sweep_once_its_claim_expires(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    refs = {uuid.UUID(str(c.ref)) for c in _reads(producer, 2).calls}
    assert len(_take(conn, queue_name, "dead", 2)) == 2
    # A sweeper claimed this worker's recovery and died before dispatching anything.
    conn.set(deliveries.recovering_key(queue_name, "dead"), "1", px=800)

    assert _recover(engine, producer) == []  # claimed by someone else
    assert conn.sismember(deliveries.workers_key(queue_name), "dead")
    time.sleep(1.0)

    assert set(_recover(engine, producer)) == refs
    assert producer.queue.count == 2
    assert not conn.sismember(deliveries.workers_key(queue_name), "dead")


def test_a_reserved_call_of_a_dead_worker_is_left_to_its_lease(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    conn.set(deliveries.epoch_key(queue_name), "e")
    (call,) = _reads(producer, 1).calls
    _take(conn, queue_name, "dead", 1)
    reserved = reservations.reserve(
        engine,
        operation_id=call.operation_id,
        call_ref=uuid.UUID(str(call.ref)),
        turn_id=uuid.UUID(_turn_of(engine, call.ref)),
        owner_token=uuid.uuid4(),
        intent_hash="intent-1",
        lease_seconds=30,
    )
    assert isinstance(reserved, reservations.Reserved)

    assert _recover(engine, producer) == []
    assert producer.queue.count == 0


def test_jobs_redis_lost_come_back_on_the_next_sweep(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    epoch = deliveries.RedisEpoch()
    refs = [uuid.UUID(str(c.ref)) for c in _reads(producer, 4).calls]
    assert producer.queue.count == 4
    # A sweeper that saw Redis' epoch before the loss.
    assert _recover(engine, producer, epoch) == []
    assert producer.queue.count == 4
    # Redis loses this queue's data (its keys, as FLUSHALL would; the shared test Redis
    # serves other queues too).
    conn.delete(f"rq:queue:{queue_name}", deliveries.epoch_key(queue_name))
    assert producer.queue.count == 0

    back = _recover(engine, producer, epoch)

    assert sorted(back) == sorted(refs)
    assert producer.queue.count == 4
    assert conn.exists(deliveries.epoch_key(queue_name))
    assert _recover(engine, producer, epoch) == []


def test_a_process_that_started_after_the_loss_notices_it(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    refs = [uuid.UUID(str(c.ref)) for c in _reads(producer, 2).calls]
    assert _recover(engine, producer, deliveries.RedisEpoch()) == []  # recorded in Postgres
    conn.delete(f"rq:queue:{queue_name}", deliveries.epoch_key(queue_name))
    # Every process that saw the old epoch is gone; one that never saw it sweeps first.
    assert sorted(_recover(engine, producer, deliveries.RedisEpoch())) == sorted(refs)
    assert producer.queue.count == 2
    assert _dispatches(engine, refs) == [2, 2]


def test_one_loss_costs_each_open_call_one_dispatch_however_many_processes_sweep(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    refs = [uuid.UUID(str(c.ref)) for c in _reads(producer, 5).calls]
    processes = [deliveries.RedisEpoch() for _ in range(6)]  # six sweeping processes
    for epoch in processes:
        assert _recover(engine, producer, epoch) == []

    for loss in (1, 2, 3):
        conn.delete(f"rq:queue:{queue_name}", deliveries.epoch_key(queue_name))
        back = [_recover(engine, producer, epoch) for epoch in processes]
        # One of them dispatches all five again; the others find them dispatched since.
        assert sorted(len(b) for b in back) == [0, 0, 0, 0, 0, 5]
        assert producer.queue.count == 5
        assert _dispatches(engine, refs) == [1 + loss] * 5
        assert [_recover(engine, producer, epoch) for epoch in processes] == [[]] * 6


def test_a_fresh_stacks_first_sweep_dispatches_nothing_again(
    engine: Engine, producer: Producer, queue_name: str
) -> None:
    conn = producer.redis
    conn.delete(deliveries.epoch_key(queue_name))  # a Redis no sweeper has seen yet
    refs = [uuid.UUID(str(c.ref)) for c in _reads(producer, 3).calls]

    assert _recover(engine, producer) == []

    assert producer.queue.count == 3
    assert _dispatches(engine, refs) == [1, 1, 1]
    assert conn.exists(deliveries.epoch_key(queue_name))


def _turn_of(engine: Engine, ref: uuid.UUID) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT turn_id FROM callgate.calls WHERE id = :r"), {"r": ref}
            ).scalar_one()
        )


def test_a_worker_that_leaves_cleanly_is_unlisted_before_its_liveness_key_goes(
    producer: Producer, queue_name: str, redis_url: str
) -> None:
    """Otherwise a sweep in between finds it listed and not alive: a dead worker to recover,
    and a warning that it stopped beating, for a worker that only stopped."""
    liveness = deliveries.Liveness(producer.redis, queue_name, "leaving")
    liveness.start()
    alive = deliveries.liveness_key(queue_name, "leaving")
    listed = deliveries.workers_key(queue_name)
    assert producer.redis.exists(alive) and producer.redis.sismember(listed, "leaving")
    watcher = redis.Redis.from_url(redis_url)
    commands: list[str] = []
    with watcher.monitor() as monitor:
        liveness.stop([])
        for event in monitor.listen():
            command = event["command"]
            if alive in command or listed in command:
                commands.append(command.split()[0].upper())
            if command.startswith("DEL") and alive in command:
                break
    watcher.close()
    assert commands.index("SREM") < commands.index("DEL"), commands
    assert not producer.redis.exists(alive)
    assert not producer.redis.sismember(listed, "leaving")
