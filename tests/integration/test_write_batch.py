"""Writes completed together, on real Postgres: one statement for the batch, every row with
its own fence; a stale owner's row changes nothing while the others commit; a lost reply is
recognised per row; a value Postgres refuses fails the batch and changes nothing; a worker
that ends many writes at once sends one completion for them.

Effects are counted in the rows (calls, operations, outbox, trace events) and in the
handler's invocations, never read off a returned flag."""

from __future__ import annotations

import threading
import time
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
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer import Producer
from callgate.producer.planning import plan
from callgate.queue import transport
from callgate.store import completions, db, reservations, turns
from callgate.tools.registry import Downstream, ExecutionContext, Registry, SideEffect, Tool
from callgate.worker import executor, group_commit
from callgate.worker.events import DeliveryOutcome
from callgate.worker.runtime import Runtime
from tests.faults.core import LOSE_REPLY
from tests.faults.pgproxy import PgProxy, sql_fault

CTX = CallContext(request_id="r-batch", tenant_id="tenant-a", user_id="u", roles=("support",))


def _scalar(engine: Engine, sql: str, **params: object) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def _count(engine: Engine, table: str, ref: uuid.UUID) -> int:
    return int(_scalar(engine, f"SELECT count(*) FROM callgate.{table} WHERE call_ref = :r", r=ref))


def _record(engine: Engine, n: int) -> list[turns.PlannedCall]:
    proposed = [
        ProposedCall(
            call_id=f"c{i}",
            tool_name="send_email",
            arguments={"to": f"p{i}@example.com", "template": "t"},
            operation_id=f"op-{uuid.uuid4().hex[:12]}",
        )
        for i in range(n)
    ]
    planned = plan(proposed, CTX, demo_registry())
    turns.record(engine, CTX, planned)
    return planned


def _reserved(engine: Engine, p: turns.PlannedCall, lease: float = 30) -> reservations.Lease:
    owner = uuid.uuid4()
    turn_id = _scalar(engine, "SELECT turn_id FROM callgate.calls WHERE id = :r", r=p.ref)
    got = reservations.reserve(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        owner_token=owner,
        intent_hash="intent-1",
        lease_seconds=lease,
    )
    assert isinstance(got, reservations.Reserved), got
    return reservations.Lease(p.operation_id, owner, got.generation, "intent-1")


def _done(lease: reservations.Lease, tag: str, status: str = "succeeded") -> completions.Completion:
    return completions.completion(lease, status, {"tag": tag}, {"request_id": "r-batch"})


def _state(engine: Engine, p: turns.PlannedCall) -> tuple[str, str | None, str]:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT c.state, c.result #>> '{data,tag}' AS tag, o.state AS op_state"
                " FROM callgate.calls c JOIN callgate.operations o USING (operation_id)"
                " WHERE c.id = :r"
            ),
            {"r": p.ref},
        ).one()
    return row.state, row.tag, row.op_state


def test_a_batch_completes_its_writes_in_one_statement(engine: Engine) -> None:
    planned = _record(engine, 4)
    batch = [_done(_reserved(engine, p), p.proposal.call_id) for p in planned]
    sent: list[int] = []
    db.on_raw_statement(engine, lambda: sent.append(1))

    done = completions.complete_many(engine, batch)

    assert len(sent) == 1
    assert [done.finished(c) for c in batch] == [1, 1, 1, 1]
    for p in planned:
        assert _state(engine, p) == ("succeeded", p.proposal.call_id, "succeeded")
        assert _count(engine, "outbox", p.ref) == 1
        events = _scalar(
            engine,
            "SELECT array_agg(event || ':' || generation ORDER BY id)"
            " FROM callgate.trace_events WHERE call_ref = :r",
            r=p.ref,
        )
        assert events == ["reserved:1", "completed:1"]


def test_a_stale_owner_in_a_batch_is_fenced_out_and_the_others_commit(engine: Engine) -> None:
    first, taken, third = _record(engine, 3)
    a = _reserved(engine, first)
    stale = _reserved(engine, taken, lease=0.05)
    c = _reserved(engine, third)
    time.sleep(0.1)
    newer = _reserved(engine, taken)  # the lease ran out: taken over, generation 2
    assert newer.generation == 2

    batch = [_done(a, "a"), _done(stale, "stale"), _done(c, "c")]
    done = completions.complete_many(engine, batch)

    assert [done.finished(x) for x in batch] == [1, None, 1]
    assert _state(engine, taken) == ("started", None, "in_progress")  # the new owner's still
    assert _count(engine, "outbox", taken.ref) == 0
    won = completions.complete_many(engine, [_done(newer, "newer")])
    assert won.finished(_done(newer, "x")) == 1
    assert _state(engine, taken) == ("succeeded", "newer", "succeeded")
    assert _count(engine, "outbox", taken.ref) == 1
    # The winner's second completion is refused too: the operation is no longer in progress.
    again = _done(newer, "again")
    assert completions.complete_many(engine, [again]).finished(again) is None
    assert _state(engine, taken) == ("succeeded", "newer", "succeeded")


def test_a_retryable_failure_ends_the_call_and_leaves_the_operation_open(engine: Engine) -> None:
    (p,) = _record(engine, 1)
    lease = _reserved(engine, p)
    failed = completions.completion(
        lease, "failed_retryable", {"code": "downstream_timeout", "message": "x"}
    )
    assert completions.complete_many(engine, [failed]).finished(failed) == 1
    state, _, op_state = _state(engine, p)
    assert (state, op_state) == ("failed_retryable", "pending")
    assert _scalar(
        engine,
        "SELECT result IS NULL FROM callgate.operations WHERE operation_id = :o",
        o=p.operation_id,
    )


def test_a_lost_reply_of_a_batch_is_recognised_per_row(
    engine: Engine, database_url: str, pg_proxy: PgProxy
) -> None:
    mine, fenced = _record(engine, 2)
    lease = _reserved(engine, mine)
    stale = _reserved(engine, fenced, lease=0.05)
    time.sleep(0.1)
    _reserved(engine, fenced)  # taken over: the stale row must not count as won on retry

    behind = db.create(pg_proxy.url(database_url), pool_size=2, application_name="batch-write")
    fault = pg_proxy.arm(sql_fault(LOSE_REPLY, r"jsonb_to_recordset", application="batch-write"))
    try:
        # The first attempt commits and its reply is lost; the retry changes nothing and
        # recognises the completion the lost attempt committed as its own.
        batch = [_done(lease, "mine"), _done(stale, "stale")]
        done = completions.complete_many(behind, batch, retry_seconds=10)
    finally:
        pg_proxy.disarm()
        behind.dispose()
    assert fault.fired.is_set()
    assert done.finished(batch[0]) == 0  # won by the lost attempt: its calls counted there
    assert done.finished(batch[1]) is None
    assert _state(engine, mine) == ("succeeded", "mine", "succeeded")
    assert _count(engine, "outbox", mine.ref) == 1
    assert _count(engine, "outbox", fenced.ref) == 0


def test_a_value_postgres_cannot_store_fails_the_batch_and_changes_nothing(
    engine: Engine,
) -> None:
    first, second = _record(engine, 2)
    a, b = _reserved(engine, first), _reserved(engine, second)
    with pytest.raises(UnstorableValue):
        completions.completion(a, "succeeded", {"n": float("nan")})
    bad = completions.completion(b, "succeeded", {"text": "a\x00b"})
    with pytest.raises(UnstorableValue):
        completions.complete_many(engine, [_done(a, "fine"), bad])
    assert _state(engine, first) == ("started", None, "in_progress")
    assert _state(engine, second) == ("started", None, "in_progress")
    assert _count(engine, "outbox", first.ref) + _count(engine, "outbox", second.ref) == 0


# --- through the worker: writes finishing together -------------------------------------


class NoteArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str


@dataclass
class Notes:
    """The write's downstream: counts its invocations; ``together`` holds that many inside
    the handler until all arrived, so they finish together."""

    written: list[tuple[str, int]] = field(default_factory=list)
    together: threading.Barrier | None = None

    def __call__(self, args: Any, ctx: ExecutionContext) -> dict[str, Any]:
        self.written.append((args.note, ctx.fencing_token))
        if self.together is not None:
            self.together.wait(timeout=10)
        return {"note": args.note}


@pytest.fixture
def notes_world(
    database_url: str, redis_url: str, queue_name: str
) -> Iterator[tuple[Runtime, Producer, Notes, Engine]]:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
        }
    )
    notes = Notes()
    registry = Registry.of(
        [
            Tool(
                "note",
                "A write.",
                NoteArgs,
                "write",
                notes,
                effect=SideEffect(idempotent=False, reversible=False),
                downstream=Downstream(idempotency_keys=True, fencing=True),
            )
        ],
        {"support": ["note"]},
    )
    engine = db.create(database_url, pool_size=8)
    rt = Runtime(
        settings=settings,
        engine=engine,
        redis=redis.Redis.from_url(redis_url),
        queue=transport.job_queue(transport.connect(redis_url), settings.queue),
        registry=registry,
    )
    producer = Producer(
        settings=settings,
        engine=engine,
        redis_connection=transport.connect(redis_url),
        registry=registry,
    )
    try:
        yield rt, producer, notes, engine
    finally:
        engine.dispose()


def _submit_notes(producer: Producer, n: int) -> list[uuid.UUID]:
    # One turn per write: writes of one turn run one after another.
    refs = []
    for i in range(n):
        turn = producer.submit(
            [{"call_id": f"w{i}", "tool_name": "note", "arguments": {"note": f"n{i}"}}],
            {"request_id": f"rb{i}", "tenant_id": "t1", "user_id": "u1", "roles": ["support"]},
        )
        refs += [uuid.UUID(c.ref) for c in turn.calls]
    return refs


def test_writes_finishing_together_are_completed_in_one_statement(
    notes_world: tuple[Runtime, Producer, Notes, Engine],
) -> None:
    rt, producer, notes, engine = notes_world
    refs = _submit_notes(producer, 3)
    notes.together = threading.Barrier(3)
    batch = group_commit.for_engine(engine)
    batch.window_seconds = 0.5  # long enough for three threads on a loaded machine
    completes: list[int] = []
    db.on_raw_statement(engine, lambda: completes.append(1))
    outcomes: list[DeliveryOutcome] = []

    def deliver(ref: uuid.UUID, ticket: group_commit.Ticket) -> None:
        outcomes.append(executor.execute(rt, ref, ticket=ticket))

    # Tickets taken together, as a take of three jobs does: the leader waits for the others.
    tickets = [batch.enter() for _ in refs]
    threads = [threading.Thread(target=deliver, args=a) for a in zip(refs, tickets, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert [o.value for o in outcomes] == ["succeeded"] * 3
    assert sorted(n for n, _ in notes.written) == ["n0", "n1", "n2"]
    # Per write: its load, its reservation; then one completion for the three.
    assert len(completes) == 3 * 2 + 1
    for ref in refs:
        assert _scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=ref) == (
            "succeeded"
        )
        assert _count(engine, "outbox", ref) == 1
