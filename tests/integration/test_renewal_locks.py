"""Lease renewal against locks other transactions really hold on operation rows.

A submit that reuses an in-flight operation id holds ``FOR KEY SHARE`` on its row (the
foreign-key check of its call) until it commits; a long transaction, a completion or a
takeover may hold a stronger lock on one row. None of them may delay the renewal of another
operation's lease, nor deadlock with it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import db, reservations, turns
from callgate.worker.heartbeat import Heartbeat

CTX = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
JOIN_SECONDS = 10.0  # generous: a renewal that is not blocked takes milliseconds


def _in_flight(engine: Engine, lease_seconds: float = 5.0) -> reservations.Lease:
    """An operation reserved by a live owner, as a worker holds it while its handler runs."""
    call = ProposedCall(
        call_id="c1", tool_name="send_email", arguments={"to": "a@b.c", "template": "t"}
    )
    (planned,) = plan([call], CTX, demo_registry())
    turns.record(engine, CTX, [planned])
    with engine.connect() as conn:
        turn_id = conn.execute(
            text("SELECT turn_id FROM callgate.calls WHERE id = :r"), {"r": planned.ref}
        ).scalar_one()
    owner = uuid.uuid4()
    reserved = reservations.reserve(
        engine,
        operation_id=planned.operation_id,
        call_ref=planned.ref,
        turn_id=turn_id,
        owner_token=owner,
        intent_hash="intent-1",
        lease_seconds=lease_seconds,
    )
    assert isinstance(reserved, reservations.Reserved)
    return reservations.Lease(planned.operation_id, owner, reserved.generation, "intent-1")


class _Submit:
    """A submit's transaction on a connection of its own, stalled before its COMMIT: the
    statements ``turns.record`` sends for calls that reuse operation ids."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(db.libpq_url(url), application_name="stalled-submit")
        self.turn_id = uuid.uuid4()
        self.position = 0
        self.conn.execute(
            "INSERT INTO callgate.turns (turn_id, request_id, tenant_id, user_id, roles)"
            " VALUES (%s, 'r', 'tenant-a', 'user-17', ARRAY['support'])",
            (self.turn_id,),
        )

    def reuse(self, operation_id: str) -> None:
        self.conn.execute(
            "INSERT INTO callgate.operations (operation_id, tenant_id, tool_name,"
            " idempotency_key) VALUES (%s, 'tenant-a', 'send_email', %s)"
            " ON CONFLICT (operation_id) DO NOTHING",
            (operation_id, f"k-{uuid.uuid4()}"),
        )
        # The foreign-key check takes FOR KEY SHARE on the operation row until COMMIT.
        self.conn.execute(
            "INSERT INTO callgate.calls (id, turn_id, call_id, position, tool_name, arguments,"
            " kind, operation_id, args_hash, state, dispatches)"
            " VALUES (%s, %s, %s, %s, 'send_email', '{}', 'write', %s, 'h', 'proposed', 0)",
            (uuid.uuid4(), self.turn_id, f"s{self.position}", self.position, operation_id),
        )
        self.position += 1

    def close(self, *, commit: bool = False) -> None:
        if not self.conn.closed:
            if commit:
                self.conn.commit()
            self.conn.close()  # rolls back an open transaction


@pytest.fixture
def submits(database_url: str) -> Iterator[list[_Submit]]:
    opened: list[_Submit] = []
    yield opened
    for s in opened:
        s.close()


def _stalled_submit(database_url: str, submits: list[_Submit], *operation_ids: str) -> _Submit:
    s = _Submit(database_url)
    submits.append(s)
    for op in operation_ids:
        s.reuse(op)
    return s


class _InThread:
    """Run ``fn`` on a thread; ``join`` says whether it finished, and keeps its outcome."""

    def __init__(self, fn: Any) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = JOIN_SECONDS) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def _renew(engine: Engine, leases: list[reservations.Lease], seconds: float = 60.0) -> Any:
    with db.raw_autocommit(engine) as conn:
        return reservations.renew_many(conn, [(lease, seconds) for lease in leases])


def _key(lease: reservations.Lease) -> tuple[str, uuid.UUID, int]:
    return (lease.operation_id, lease.owner_token, lease.generation)


def _seconds_left(engine: Engine, lease: reservations.Lease) -> float:
    """The lease's remaining time on Postgres' clock."""
    with engine.connect() as conn:
        return float(
            conn.execute(
                text(
                    "SELECT EXTRACT(EPOCH FROM lease_expires_at - now())"
                    " FROM callgate.operations WHERE operation_id = :o"
                ),
                {"o": lease.operation_id},
            ).scalar_one()
        )


def _waiting_on_a_lock(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_a_stalled_submit_reusing_an_operation_does_not_block_renewal(
    engine: Engine, database_url: str, submits: list[_Submit]
) -> None:
    reused, other = _in_flight(engine), _in_flight(engine)
    _stalled_submit(database_url, submits, reused.operation_id)

    renewal = _InThread(lambda: _renew(engine, [reused, other]))
    finished = renewal.join()
    submits[0].close()  # let a blocked renewal go, so the thread ends either way
    renewal.join()
    assert finished, "the renewal waited on the stalled submit's lock"
    assert renewal.error is None
    assert renewal.result.renewed == {_key(reused), _key(other)}
    # Renewed in Postgres: 60 s from now, against the 5 s the reservation gave.
    assert _seconds_left(engine, reused) > 30 and _seconds_left(engine, other) > 30


def test_a_row_lock_held_on_one_operation_delays_no_other_lease(
    engine: Engine, database_url: str
) -> None:
    """A long transaction holding FOR UPDATE on one operation row (as a completion or a
    takeover in progress does for a moment) leaves every other lease renewed; the locked one
    is neither renewed nor reported lost, and is renewed once the lock goes."""
    locked, free = _in_flight(engine), _in_flight(engine)
    with psycopg.connect(db.libpq_url(database_url)) as holder:
        holder.execute(
            "SELECT 1 FROM callgate.operations WHERE operation_id = %s FOR UPDATE",
            (locked.operation_id,),
        )
        renewal = _InThread(lambda: _renew(engine, [locked, free]))
        finished = renewal.join()
        free_left = _seconds_left(engine, free)
        holder.rollback()
    renewal.join()
    assert finished, "the renewal of every lease waited on one row's lock"
    assert renewal.error is None
    assert renewal.result.renewed == {_key(free)} and free_left > 30
    assert renewal.result.busy == {_key(locked)}  # still its owner's: not lost
    assert _seconds_left(engine, locked) < 30  # not renewed while the lock was held

    after = _renew(engine, [locked, free])
    assert after.renewed == {_key(locked), _key(free)} and not after.busy
    assert _seconds_left(engine, locked) > 30


def test_a_submit_reusing_two_operations_does_not_deadlock_with_a_renewal(
    engine: Engine, database_url: str, submits: list[_Submit]
) -> None:
    """The submit's FK checks lock the higher operation id first, then the lower one; a
    renewal batch locks in operation id order. Nothing may abort either of them."""
    low, high = sorted((_in_flight(engine), _in_flight(engine)), key=lambda x: x.operation_id)
    submit = _stalled_submit(database_url, submits, high.operation_id)

    renewal = _InThread(lambda: _renew(engine, [low, high]))
    deadline = time.monotonic() + JOIN_SECONDS
    while renewal.thread.is_alive() and not _waiting_on_a_lock(engine):
        assert time.monotonic() < deadline, "the renewal neither ended nor waited"
        time.sleep(0.02)
    # The submit's next call reuses the lower operation id: its FK check needs that row.
    submit_error: BaseException | None = None
    try:
        submit.reuse(low.operation_id)
        submit.close(commit=True)
    except psycopg.Error as exc:
        submit_error = exc
        submit.close()
    renewal.join()
    assert submit_error is None, f"the submit was aborted: {submit_error!r}"
    assert renewal.error is None, f"the renewal was aborted: {renewal.error!r}"
    assert renewal.result.renewed == {_key(low), _key(high)}
    with engine.connect() as conn:
        reusing = conn.execute(
            text("SELECT count(*) FROM callgate.calls WHERE turn_id = :t"), {"t": submit.turn_id}
        ).scalar_one()
    assert reusing == 2  # the submit's turn is recorded whole


def test_the_heartbeat_keeps_renewing_through_a_stalled_submit(
    engine: Engine, database_url: str, submits: list[_Submit]
) -> None:
    """The worker's own renew path: a heartbeat per call, one renewal thread, a submit stalled
    for two lease lengths on one of the operations. Every lease stays live, none is lost, and
    leaving the heartbeat (``remove``) does not wait for the submit."""
    lease_seconds = 3.0
    reused, other = _in_flight(engine, lease_seconds), _in_flight(engine, lease_seconds)
    stall = _stalled_submit(database_url, submits, reused.operation_id)
    beats = [Heartbeat(engine, lease, lease_seconds) for lease in (reused, other)]
    for beat in beats:
        beat.__enter__()
    try:
        # Two lease lengths: without renewals both leases would have run out (on
        # Postgres' clock) by the end.
        time.sleep(2 * lease_seconds)
        left = [_seconds_left(engine, lease) for lease in (reused, other)]
        lost = [beat.lost.is_set() for beat in beats]
        renewals = [beat.renewals for beat in beats]
        leaving = _InThread(lambda: [beat.__exit__(None, None, None) for beat in beats])
        left_in_time = leaving.join()
    finally:
        stall.close()
        for beat in beats:
            beat.__exit__(None, None, None)
    assert left_in_time, "leaving the heartbeat waited on the stalled submit"
    assert lost == [False, False]
    assert min(renewals) >= 2, renewals
    assert min(left) > 0, f"a lease ran out during the stall: {left}"
