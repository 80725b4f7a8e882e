"""A read's fast path on real Postgres and Redis: no reservation, one guarded statement that
ends the call, its outbox row and its audit; a read delivered twice may run twice and still
ends once; a batch whose one row is stale ends the others; a lost reply is recognised per
row; a hung read on a live worker is dispatched again after the job timeout.

Effects are counted where they happen (the handler's invocations, the outbox rows, the trace
rows), never read off a returned flag."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, text

from callgate.core.errors import UnstorableValue
from callgate.core.settings import Settings
from callgate.daemons import sweeper
from callgate.producer import Producer
from callgate.queue import deliveries, transport
from callgate.store import audit, db, endings
from callgate.tools.registry import READ_ONLY, ExecutionContext, Registry, Tool
from callgate.worker import executor
from callgate.worker.events import DeliveryOutcome
from callgate.worker.runtime import Runtime
from tests.faults.core import LOSE_REPLY
from tests.faults.pgproxy import PgProxy, sql_fault

CONTEXT = {"request_id": "req-fast", "tenant_id": "t1", "user_id": "u1", "roles": ["support"]}


class TokenArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str


@dataclass
class Probe:
    """The read's handler: counts its invocations; ``together`` makes that many invocations
    wait for each other inside the handler (two deliveries both running it)."""

    invocations: list[str] = field(default_factory=list)
    together: threading.Barrier | None = None
    returns: dict[str, Any] | None = None

    def __call__(self, args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        self.invocations.append(args.token)
        if self.together is not None:
            self.together.wait(timeout=10)
        if self.returns is not None:
            return self.returns
        return {"tag": args.token, "run": len(self.invocations)}


@dataclass
class World:
    engine: Engine
    rt: Runtime
    producer: Producer
    probe: Probe

    def submit(self, n: int = 1) -> list[uuid.UUID]:
        turn = self.producer.submit(
            [
                {"call_id": f"c{i}", "tool_name": "probe", "arguments": {"token": f"t{i}"}}
                for i in range(n)
            ],
            CONTEXT,
        )
        return [uuid.UUID(c.ref) for c in turn.calls]

    def one(self, sql: str, **params: Any) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(text(sql), params).one()

    def count(self, table: str, ref: uuid.UUID) -> int:
        return int(self.one(f"SELECT count(*) FROM callgate.{table} WHERE call_ref = :r", r=ref)[0])


def _runtime(settings: Settings, engine: Engine, redis_url: str, registry: Registry) -> Runtime:
    connection = transport.connect(redis_url)
    return Runtime(
        settings=settings,
        engine=engine,
        redis=redis.Redis.from_url(redis_url),
        queue=transport.job_queue(connection, settings.queue),
        registry=registry,
    )


@pytest.fixture
def world(database_url: str, redis_url: str, queue_name: str) -> Iterator[World]:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
        }
    )
    probe = Probe()
    registry = Registry.of(
        [Tool("probe", "A read.", TokenArgs, "read", probe, effect=READ_ONLY)],
        {"support": ["probe"]},
    )
    engine = db.create(database_url, pool_size=4)
    rt = _runtime(settings, engine, redis_url, registry)
    producer = Producer(
        settings=settings,
        engine=engine,
        redis_connection=transport.connect(redis_url),
        registry=registry,
    )
    try:
        yield World(engine, rt, producer, probe)
    finally:
        engine.dispose()


def test_a_read_ends_in_one_statement_with_no_reservation(world: World) -> None:
    (ref,) = world.submit()
    sent: list[int] = []
    db.on_raw_statement(world.engine, lambda: sent.append(1))

    assert executor.execute(world.rt, ref) is DeliveryOutcome.SUCCEEDED

    assert len(sent) == 2  # the load and the ending: no reservation, no trace row
    assert world.probe.invocations == ["t0"]
    row = world.one(
        "SELECT c.state, c.result, c.audit, o.state AS op_state, o.generation,"
        " o.result AS op_result FROM callgate.calls c JOIN callgate.operations o"
        " USING (operation_id) WHERE c.id = :r",
        r=ref,
    )
    assert row.state == "succeeded" and row.result["data"]["content"]["tag"] == "t0"
    assert row.op_state == "pending" and row.generation == 0 and row.op_result is None
    assert row.audit["verdicts"]["schema"] == "pass" and "duration_ms" in row.audit
    assert world.count("outbox", ref) == 1
    assert world.count("trace_events", ref) == 0
    # `callgate trace` shows the audit stored on the call as its `completed` event.
    shown = audit.events(world.engine, str(ref))
    assert [(e["event"], e["detail"]["status"]) for e in shown] == [("completed", "succeeded")]
    assert "delivery" not in shown[0]["detail"]


def test_a_read_delivered_twice_may_run_twice_and_ends_once(world: World) -> None:
    (ref,) = world.submit()
    world.probe.together = threading.Barrier(2)  # both deliveries inside the handler at once
    outcomes: list[DeliveryOutcome] = []

    def deliver() -> None:
        outcomes.append(executor.execute(world.rt, ref))

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert len(world.probe.invocations) == 2
    assert sorted(o.value for o in outcomes) == ["duplicate_delivery", "succeeded"]
    assert world.count("outbox", ref) == 1  # one result published
    row = world.one("SELECT state, result FROM callgate.calls WHERE id = :r", r=ref)
    assert row.state == "succeeded" and row.result["data"]["content"]["run"] in (1, 2)
    events = [e["event"] for e in audit.events(world.engine, str(ref))]
    assert sorted(events) == ["completed", "duplicate_delivery"]


def _ending(ref: uuid.UUID, token: str) -> endings.Ending:
    return endings.ending(ref, "succeeded", {"token": token}, {"request_id": "req-fast"})


def test_a_batch_whose_one_row_is_stale_ends_the_others(world: World) -> None:
    first, stale, third = world.submit(3)
    earlier = _ending(stale, "earlier")
    assert endings.end_reads(world.engine, [earlier]).ended(earlier)

    batch = [_ending(first, "a"), _ending(stale, "late"), _ending(third, "c")]
    done = endings.end_reads(world.engine, batch)

    assert [done.ended(e) for e in batch] == [True, False, True]
    for ref, token in ((first, "a"), (stale, "earlier"), (third, "c")):
        row = world.one("SELECT result FROM callgate.calls WHERE id = :r", r=ref)
        assert row.result["data"]["token"] == token
        assert world.count("outbox", ref) == 1


def test_two_endings_of_one_read_in_one_batch_end_it_once(world: World) -> None:
    (ref,) = world.submit()
    a, b = _ending(ref, "a"), _ending(ref, "b")

    done = endings.end_reads(world.engine, [a, b])

    assert [done.ended(a), done.ended(b)].count(True) == 1
    assert world.count("outbox", ref) == 1


def test_a_batch_ends_its_reads_in_one_statement(
    world: World,
) -> None:
    refs = world.submit(5)
    sent: list[int] = []
    db.on_raw_statement(world.engine, lambda: sent.append(1))

    batch = [_ending(r, str(i)) for i, r in enumerate(refs)]
    done = endings.end_reads(world.engine, batch)

    assert all(done.ended(e) for e in batch) and len(sent) == 1
    assert sum(world.count("outbox", r) for r in refs) == 5


def test_a_lost_reply_of_an_ending_is_recognised_per_row(
    world: World, database_url: str, pg_proxy: PgProxy
) -> None:
    mine, other = world.submit(2)
    behind = db.create(pg_proxy.url(database_url), pool_size=2, application_name="fast-read")
    fault = pg_proxy.arm(sql_fault(LOSE_REPLY, r"jsonb_to_recordset", application="fast-read"))
    try:
        # The first attempt commits and its reply is lost; the retry ends nothing new and
        # recognises the row the lost attempt ended as its own, by its delivery token.
        ending = _ending(mine, "mine")
        done = endings.end_reads(behind, [ending], retry_seconds=10)
    finally:
        pg_proxy.disarm()
        behind.dispose()
    assert fault.fired.is_set()
    assert done.ended(ending)
    assert world.count("outbox", mine) == 1
    # A row another delivery ended is not mistaken for this one's.
    endings.end_reads(world.engine, [_ending(other, "theirs")])
    again = _ending(other, "again")
    assert not endings.end_reads(world.engine, [again]).ended(again)


def test_a_result_postgres_cannot_store_raises_and_changes_nothing(world: World) -> None:
    first, second = world.submit(2)
    with pytest.raises(UnstorableValue):
        endings.ending(first, "succeeded", {"n": float("nan")}, {})
    bad = endings.ending(first, "succeeded", {"text": "a\x00b"}, {})
    with pytest.raises(UnstorableValue):
        endings.end_reads(world.engine, [_ending(second, "fine"), bad])

    states = world.one(
        "SELECT array_agg(state) FROM callgate.calls WHERE id IN (:a, :b)", a=first, b=second
    )[0]
    assert states == ["proposed", "proposed"]  # the whole batch changed nothing
    assert world.count("outbox", first) + world.count("outbox", second) == 0


def test_the_audit_on_the_call_row_never_holds_the_arguments(world: World) -> None:
    (ref,) = world.submit()
    executor.execute(world.rt, ref)
    audit = world.one("SELECT audit FROM callgate.calls WHERE id = :r", r=ref).audit
    assert "t0" not in json.dumps(audit)


def test_a_read_hung_on_a_live_worker_is_dispatched_again_after_the_job_timeout(
    world: World,
) -> None:
    hung, slow = world.submit(2)
    queue = world.rt.settings.queue
    r = world.rt.redis
    # A live worker took both (as the take script does: the job leaves the queue and its
    # hash, and is listed in the worker's taken hash) and runs them still.
    r.delete(world.rt.queue.key, *(f"rq:job:{ref}" for ref in (hung, slow)))
    r.sadd(deliveries.workers_key(queue), "w1")
    r.set(deliveries.liveness_key(queue, "w1"), 1, ex=60)
    r.hset(deliveries.taken_key(queue, "w1"), mapping={str(hung): "x", str(slow): "x"})
    with world.engine.begin() as conn:
        for ref, ago in ((hung, 400), (slow, 100)):  # both past the stale period
            conn.execute(
                text(
                    "UPDATE callgate.calls SET dispatched_at = now() - make_interval(secs => :s)"
                    " WHERE id = :r"
                ),
                {"s": ago, "r": ref},
            )

    done = sweeper.sweep_once(
        world.engine, world.rt.queue, stale_seconds=60, job_timeout=300, max_dispatches=10
    )

    # Past the job timeout; the other is still running. (Other tests' calls may be due too.)
    assert hung in done.dispatched and slow not in done.dispatched
    assert r.exists(f"rq:job:{hung}") and not r.exists(f"rq:job:{slow}")


def test_a_read_proposed_again_under_its_operation_id_reuses_its_result(world: World) -> None:
    first = world.producer.submit(
        [{"call_id": "c1", "tool_name": "probe", "arguments": {"token": "same"}}], CONTEXT
    )
    (one,) = first.calls
    assert executor.execute(world.rt, uuid.UUID(one.ref)) is DeliveryOutcome.SUCCEEDED
    # The same request in a later turn, under the same operation id (a framework re-running
    # its node after an interrupt): the result of the first run, not a second run.
    again = world.producer.submit(
        [{"call_id": "c2", "tool_name": "probe", "arguments": {"token": "same"}}],
        CONTEXT,
        operation_ids={"c2": one.operation_id},
    )
    (two,) = again.calls
    assert executor.execute(world.rt, uuid.UUID(two.ref)) is DeliveryOutcome.REUSED

    assert world.probe.invocations == ["same"]
    first_result = world.one("SELECT result FROM callgate.calls WHERE id = :r", r=one.ref)[0]
    second_result = world.one("SELECT result FROM callgate.calls WHERE id = :r", r=two.ref)[0]
    assert second_result["data"] == first_result["data"] and second_result["call_id"] == "c2"
    assert world.count("outbox", uuid.UUID(two.ref)) == 1
