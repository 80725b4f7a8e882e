"""Liveness and cost of the safety machinery, against real Postgres: the lease heartbeat,
the lock order of the guarantee statements, results Postgres cannot store, and a sweeper
whose cost does not grow with history."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid

import pytest
from sqlalchemy import Engine, text

from callgate.core.errors import StaleFence, UnstorableValue
from callgate.core.types import CallContext, ProposedCall
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.store import completions, endings, reservations, sweeps, turns
from callgate.tools.registry import ExecutionContext
from callgate.worker.heartbeat import Heartbeat
from tests.acceptance.conftest import wait_until

CTX = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))


def _record(engine: Engine, n: int = 1, operation_id: str | None = None) -> list[turns.PlannedCall]:
    """``n`` calls, each in a turn of its own; all on ``operation_id`` when given."""
    planned = []
    for i in range(n):
        call = ProposedCall(
            call_id=f"c{i}", tool_name="send_email", arguments={"to": "a@b.c", "template": "t"}
        )
        ops = {call.call_id: operation_id} if operation_id else None
        (p,) = plan([call], CTX, demo_registry(), ops)
        turns.record(engine, CTX, [p])
        planned.append(p)
    return planned


def _reserve(
    engine: Engine, p: turns.PlannedCall, owner: uuid.UUID, lease: float
) -> reservations.Reserved | reservations.NotReserved:
    return reservations.reserve(
        engine,
        operation_id=p.operation_id,
        call_ref=p.ref,
        turn_id=_scalar(engine, "SELECT turn_id FROM callgate.calls WHERE id = :r", r=p.ref),
        owner_token=owner,
        intent_hash="intent-1",
        lease_seconds=lease,
    )


def _taken_over(engine: Engine, p: turns.PlannedCall) -> reservations.Reserved | None:
    """A takeover by a new owner, once the lease has run out; None while it still holds."""
    taken = _reserve(engine, p, uuid.uuid4(), lease=30)
    return taken if isinstance(taken, reservations.Reserved) else None


def _scalar(engine: Engine, sql: str, **params: object) -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def _context(heartbeat: Heartbeat) -> ExecutionContext:
    return ExecutionContext(
        tenant_id="tenant-a",
        user_id="user-17",
        operation_id="op",
        idempotency_key="k",
        fencing_token=1,
        request_id="r",
        lease_lost=heartbeat.expired,
    )


# --- hole 17: the heartbeat ---------------------------------------------------------------


def test_heartbeat_renews_so_nobody_takes_over_while_the_handler_runs(engine: Engine) -> None:
    (p,) = _record(engine)
    owner = uuid.uuid4()
    reserved = _reserve(engine, p, owner, lease=0.6)
    assert isinstance(reserved, reservations.Reserved)
    lease = reservations.Lease(p.operation_id, owner, reserved.generation, "intent-1")
    with Heartbeat(engine, lease, 0.6) as heartbeat:
        time.sleep(2.0)  # more than three leases
        other = _reserve(engine, p, uuid.uuid4(), lease=0.6)
        assert isinstance(other, reservations.NotReserved) and other.reason == "busy"
        assert not heartbeat.expired()
        _context(heartbeat).ensure_lease()  # still ours: no error
    assert heartbeat.renewals >= 3
    # No heartbeat now: the lease runs out (on Postgres' clock, however loaded this machine
    # is), and then, not before, another owner takes the call over.
    taken = wait_until(
        lambda: _taken_over(engine, p), timeout=10, what="a takeover after the lease ran out"
    )
    assert taken == reservations.Reserved(reserved.generation + 1, takeover=True)


def test_a_heartbeat_that_finds_a_takeover_tells_the_handler(engine: Engine) -> None:
    (p,) = _record(engine)
    owner = uuid.uuid4()
    reserved = _reserve(engine, p, owner, lease=0.3)
    assert isinstance(reserved, reservations.Reserved)
    time.sleep(0.4)
    assert isinstance(_reserve(engine, p, uuid.uuid4(), lease=30), reservations.Reserved)
    stale = reservations.Lease(p.operation_id, owner, reserved.generation, "intent-1")
    with Heartbeat(engine, stale, 0.3) as heartbeat:
        deadline = time.monotonic() + 3
        while not heartbeat.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert heartbeat.lost.is_set()
        with pytest.raises(StaleFence):
            _context(heartbeat).ensure_lease()


def test_one_renewal_thread_renews_many_leases_and_tells_only_the_stale_one(
    engine: Engine,
) -> None:
    """The heartbeats of a process share one thread and one statement per batch; each lease
    keeps its own guard: a lease taken over is lost, the others are renewed."""
    calls = _record(engine, 6)
    leases = []
    for p in calls:
        owner = uuid.uuid4()
        reserved = _reserve(engine, p, owner, lease=0.6)
        assert isinstance(reserved, reservations.Reserved)
        leases.append(reservations.Lease(p.operation_id, owner, reserved.generation, "i"))
    # The last one's lease is taken over behind its back (a stalled owner).
    stale = leases[-1]
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE callgate.operations SET generation = generation + 1,"
                " owner_token = gen_random_uuid() WHERE operation_id = :o"
            ),
            {"o": stale.operation_id},
        )
    before = [t.name for t in threading.enumerate()].count("lease-heartbeat")
    beats = [Heartbeat(engine, lease, 0.6) for lease in leases]
    for beat in beats:
        beat.__enter__()
    try:
        assert [t.name for t in threading.enumerate()].count("lease-heartbeat") <= before + 1
        time.sleep(1.5)  # several leases long
        for p in calls[:-1]:
            other = _reserve(engine, p, uuid.uuid4(), lease=0.6)
            assert isinstance(other, reservations.NotReserved) and other.reason == "busy"
        assert all(b.renewals >= 3 and not b.expired() for b in beats[:-1])
        assert beats[-1].lost.is_set() and beats[-1].renewals == 0
    finally:
        for beat in beats:
            beat.__exit__(None, None, None)


def test_a_handler_holding_the_gil_loses_its_lease_and_is_told(
    engine: Engine, database_url: str
) -> None:
    size = _gil_hog_size(seconds=2.0)
    (p,) = _record(engine)
    owner = uuid.uuid4()
    reserved = _reserve(engine, p, owner, lease=0.3)
    assert isinstance(reserved, reservations.Reserved)
    lease = reservations.Lease(p.operation_id, owner, reserved.generation, "intent-1")
    # Another worker, in another process, takes over once the lease has run out.
    takeover = subprocess.Popen(
        [
            "psql",
            database_url,
            "-qtAc",
            "SELECT pg_sleep(0.7);"
            " UPDATE callgate.operations SET generation = generation + 1,"
            " owner_token = gen_random_uuid(), lease_expires_at = now() + interval '30 s'"
            f" WHERE operation_id = '{p.operation_id}' AND lease_expires_at < clock_timestamp()"
            " RETURNING generation",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    with Heartbeat(engine, lease, 0.3) as heartbeat:
        renewals = heartbeat.renewals
        # One call into C that never releases the GIL: the renewal thread cannot run.
        _gil_hog(size)
        out, _ = takeover.communicate(timeout=10)
        assert out.strip() == str(reserved.generation + 1), "the other worker took over"
        deadline = time.monotonic() + 3
        while not heartbeat.expired() and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(StaleFence):
            _context(heartbeat).ensure_lease()
    assert heartbeat.lost.is_set()
    assert renewals == 0


def _gil_hog(size: int) -> None:
    re.match(r"(a*)*b", "a" * size)  # catastrophic backtracking, all inside the re module


def _gil_hog_size(seconds: float) -> int:
    """The input size for which one ``_gil_hog`` call lasts about ``seconds`` here (each
    extra character doubles it)."""
    size, took = 16, 0.0
    while took < seconds / 2:
        size += 1
        started = time.monotonic()
        _gil_hog(size)
        took = time.monotonic() - started
    return size + 1


# --- hole 4: one lock order -----------------------------------------------------------------


def test_completion_locks_the_calls_before_the_operation(engine: Engine) -> None:
    """A reservation locks its call, then the operation. A completion of the same operation
    must not hold the operation while it waits for that call, or the two deadlock."""
    op = f"op-shared-{uuid.uuid4().hex}"
    first, second = _record(engine, 2, operation_id=op)
    owner = uuid.uuid4()
    reserved = _reserve(engine, first, owner, lease=30)
    assert isinstance(reserved, reservations.Reserved)
    lease = reservations.Lease(op, owner, reserved.generation, "intent-1")

    deadlocks = _deadlocks(engine)
    outcome: list[object] = []
    with engine.connect() as reserving:
        tx = reserving.begin()
        # A reservation of the second call, half-way: it holds the call row.
        reserving.execute(
            text("SELECT 1 FROM callgate.calls WHERE id = :r FOR UPDATE"), {"r": second.ref}
        )
        completing = threading.Thread(
            target=lambda: outcome.append(
                completions.complete(engine, lease, status="succeeded", payload={"ok": 1})
            )
        )
        completing.start()
        time.sleep(0.5)  # the completion is now waiting for the second call's row
        reserving.execute(text("SET LOCAL lock_timeout = '3s'"))
        # ...and the reservation's next step, the operation row, must not be held by it.
        reserving.execute(
            text("SELECT 1 FROM callgate.operations WHERE operation_id = :o FOR UPDATE"),
            {"o": op},
        )
        tx.rollback()
    completing.join(10)
    # Postgres found no deadlock (a victim would have been retried, hiding it from `done`).
    time.sleep(1.2)  # backends report their counters at most once a second
    assert _deadlocks(engine) == deadlocks
    (done,) = outcome
    assert isinstance(done, endings.Finished) and done.won and done.finished == 1


def _deadlocks(engine: Engine) -> int:
    return int(
        _scalar(
            engine,
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        or 0
    )


# --- hole 11: a completion that can never commit ------------------------------------------


def test_a_result_postgres_cannot_store_raises_and_changes_nothing(engine: Engine) -> None:
    (p,) = _record(engine)
    owner = uuid.uuid4()
    reserved = _reserve(engine, p, owner, lease=30)
    assert isinstance(reserved, reservations.Reserved)
    lease = reservations.Lease(p.operation_id, owner, reserved.generation, "intent-1")
    for payload in ({"text": "a\x00b"}, {"n": float("nan")}):
        with pytest.raises(UnstorableValue):
            completions.complete(engine, lease, status="succeeded", payload=payload)
    assert _scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=p.ref) == "started"
    done = completions.complete(engine, lease, status="succeeded", payload={"text": "ok"})
    assert done.won and done.finished == 1


# --- hole 18: the sweeper's cost ------------------------------------------------------------


def test_the_sweeper_reads_only_open_and_parked_calls(engine: Engine) -> None:
    (p,) = _record(engine)
    with engine.begin() as conn:
        # History: 20,000 finished calls of one old turn.
        conn.execute(
            text(
                "INSERT INTO callgate.calls (id, turn_id, call_id, position, tool_name,"
                " arguments, kind, operation_id, args_hash, state, result, completed_at)"
                " SELECT gen_random_uuid(), c.turn_id, 'h' || g, g + 1, c.tool_name, '{}',"
                " 'read', c.operation_id, '', 'succeeded', '{}', now()"
                " FROM callgate.calls AS c, generate_series(1, 20000) AS g WHERE c.id = :r"
            ),
            {"r": p.ref},
        )
        conn.execute(text("ANALYZE callgate.calls"))
        plans = [
            conn.execute(text("EXPLAIN (FORMAT JSON) " + sql), params).scalar()
            for sql, params in (
                (
                    sweeps.DUE_SQL,
                    {"stale_seconds": 60, "successor_grace": 5, "job_timeout": 300, "batch": 100},
                ),
                # The recovery of a Redis found empty: every open call, no refs.
                (
                    sweeps.LOST_SQL,
                    {"refs": None, "since": None, "max_dispatches": 5, "batch": 100},
                ),
            )
        ]
    for plan_rows in plans:
        plan = plan_rows[0]["Plan"] if isinstance(plan_rows, list) else json.loads(plan_rows)
        scans = _scans(plan)
        assert ("Seq Scan", "calls") not in scans, scans


def _scans(node: dict[str, object]) -> list[tuple[str, str]]:
    found = [(str(node.get("Node Type")), str(node.get("Relation Name")))]
    for child in node.get("Plans", []) or []:  # type: ignore[union-attr]
        found += _scans(child)  # type: ignore[arg-type]
    return found
