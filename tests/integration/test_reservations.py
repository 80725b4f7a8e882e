"""The guarantee statements against real Postgres: one winner, takeover, fenced completion."""

from __future__ import annotations

import threading
import time
import uuid

from sqlalchemy import Engine, text

from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import completions, reservations, turns

CTX = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))


def _record(engine: Engine) -> turns.PlannedCall:
    call = ProposedCall(
        call_id="c1", tool_name="send_email", arguments={"to": "a@b.c", "template": "t"}
    )
    (planned,) = plan([call], CTX, demo_registry())
    turns.record(engine, CTX, [planned])
    return planned


def _reserve(engine: Engine, p: turns.PlannedCall, owner: uuid.UUID, lease: float = 30):
    turn_id = _scalar(engine, "SELECT turn_id FROM callgate.calls WHERE id = :r", r=p.ref)
    return reservations.reserve(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        owner_token=owner,
        intent_hash="intent-1",
        lease_seconds=lease,
    )


def _scalar(engine: Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def test_exactly_one_of_many_concurrent_reservations_wins(engine: Engine) -> None:
    p = _record(engine)
    barrier = threading.Barrier(8)
    outcomes: list[object] = []

    def contend() -> None:
        barrier.wait()
        outcomes.append(_reserve(engine, p, uuid.uuid4()))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if isinstance(o, reservations.Reserved)]
    assert len(winners) == 1 and winners[0].generation == 1
    assert all(
        (o.reason, o.generation) == ("busy", 1)
        for o in outcomes
        if isinstance(o, reservations.NotReserved)
    )
    assert (
        _scalar(
            engine,
            "SELECT generation FROM callgate.operations WHERE operation_id = :o",
            o=p.operation_id,
        )
        == 1
    )


def test_expired_lease_is_taken_over_and_the_old_owner_cannot_complete(engine: Engine) -> None:
    p = _record(engine)
    a, b = uuid.uuid4(), uuid.uuid4()
    assert _reserve(engine, p, a, lease=0.05) == reservations.Reserved(1, takeover=False)
    time.sleep(0.1)
    assert _reserve(engine, p, b) == reservations.Reserved(2, takeover=True)

    stale = reservations.Lease(p.operation_id, a, 1, "intent-1")
    with engine.connect() as conn:
        assert reservations.renew(conn, stale, 30) is False
    lost = completions.complete(engine, stale, status="succeeded", payload={"by": "a"})
    assert not lost.won and lost.finished == 0
    assert _scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=p.ref) == "started"

    fresh = reservations.Lease(p.operation_id, b, 2, "intent-1")
    won = completions.complete(engine, fresh, status="succeeded", payload={"by": "b"})
    assert won.won and won.finished == 1
    assert (
        _scalar(engine, "SELECT result #>> '{data,by}' FROM callgate.calls WHERE id = :r", r=p.ref)
        == "b"
    )
    assert _scalar(engine, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=p.ref) == 1
    # A second completion by the winner is also refused: the operation is no longer in progress.
    assert not completions.complete(engine, fresh, status="succeeded", payload={"by": "b"}).won


def test_same_operation_with_a_different_intent_is_a_conflict(engine: Engine) -> None:
    p = _record(engine)
    turn_id = _scalar(engine, "SELECT turn_id FROM callgate.calls WHERE id = :r", r=p.ref)
    first = _reserve(engine, p, uuid.uuid4())
    assert isinstance(first, reservations.Reserved)
    other = reservations.reserve(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=turn_id,
        owner_token=uuid.uuid4(),
        intent_hash="intent-2",
        lease_seconds=30,
    )
    assert isinstance(other, reservations.NotReserved)
    assert (other.reason, other.generation) == ("conflict", 1)


def test_reject_ends_a_call_once(engine: Engine) -> None:
    p = _record(engine)
    error = {"code": "tool_not_allowed", "details": []}
    first = reservations.reject(engine, call_ref=p.ref, status="failed_terminal", error=error)
    second = reservations.reject(engine, call_ref=p.ref, status="failed_terminal", error=error)
    assert (first.finished, second.finished) == (1, 0)
    assert _scalar(engine, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=p.ref) == 1
