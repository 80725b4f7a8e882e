"""SIGTERM's grace is a limit: a worker whose handler is still running when the grace ends
stops renewing that call's lease and exits, and another worker takes the call over once the
lease runs out, applying its write once."""

from __future__ import annotations

import signal
import time

from sqlalchemy import Engine

from callgate.queue import deliveries, transport
from tests.acceptance.conftest import effects_for, requests_for, scalar, wait_until
from tests.acceptance.private_stack import (
    database_url,
    env,
    key_of,
    make_producer,
    only_result,
    start,
    submit_one,
    worker_without_delay,
)
from tests.acceptance.processes import private_redis

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures

GRACE = 2
LEASE = 3  # renewed every second while its handler runs


def _lease_expires_at(engine: Engine, operation_id: str) -> object:
    return scalar(
        engine,
        "SELECT lease_expires_at FROM callgate.operations WHERE operation_id = :o",
        o=operation_id,
    )


def test_a_handler_past_the_grace_loses_its_lease_and_the_worker_exits(
    start, make_producer, engine, env
):
    s = start(
        workers=1,
        CALLGATE_WORKER_GRACE_SECONDS=str(GRACE),
        CALLGATE_LEASE_SECONDS=str(LEASE),
        CALLGATE_STALE_SECONDS="60",
        CALLGATE_DEMO_DELAY_MS="send_email=0:60000",  # hangs a minute after its write
    )
    producer = make_producer()
    turn_id, _ref, op = submit_one(producer, "send_email", {"to": "u@x.test", "template": "hi"})
    key = key_of(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the write applied")
    redis = transport.connect(env["CALLGATE_REDIS_URL"])
    (name,) = redis.smembers(deliveries.workers_key(env["CALLGATE_QUEUE"]))
    alive = deliveries.liveness_key(env["CALLGATE_QUEUE"], name.decode())
    assert redis.exists(alive)

    s.signal("worker-1", signal.SIGTERM)
    # The worker drops its liveness key once the grace is over.
    wait_until(lambda: not redis.exists(alive), timeout=GRACE + 15, what="the grace to end")
    first = _lease_expires_at(engine, op)
    time.sleep(LEASE * 0.9)  # a renewer still at work would have renewed at least twice
    second = _lease_expires_at(engine, op)
    assert first == second, f"the lease still moves after the grace: {first} -> {second}"
    try:
        code = s.procs["worker-1"].wait(timeout=15)  # the handler would sleep 60 s
    except Exception:
        raise AssertionError("the worker is still running after its grace") from None
    assert code == 0

    worker_without_delay(s, "worker-2")  # takes the call over once its lease runs out
    result = only_result(producer, turn_id, timeout=30)
    assert result.status == "succeeded"
    # The demo mail honours idempotency keys: sent twice, applied once.
    assert requests_for(engine, key) == 2
    assert effects_for(engine, key) == 1


def test_a_result_held_through_a_postgres_outage_is_committed_before_the_worker_exits(
    start, make_producer, engine, env, database_url, pg_proxy
):
    """SIGTERM while PostgreSQL is away: a write that applied and whose handler returned
    holds the only copy of its result, so the worker waits past its grace, while the lease
    may still be its own, and commits it when PostgreSQL is back."""
    outage = 8.0
    s = start(
        workers=1,
        CALLGATE_DATABASE_URL=pg_proxy.url(database_url),
        CALLGATE_DOWNSTREAM_DATABASE_URL=database_url,  # the charge itself is not cut off
        CALLGATE_WORKER_GRACE_SECONDS=str(GRACE),
        CALLGATE_LEASE_SECONDS="20",
        CALLGATE_STALE_SECONDS="60",
        CALLGATE_DEMO_DELAY_MS="charge_legacy=0:1000",  # returns 1 s after its charge
    )
    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "charge_legacy", {"amount": 7})
    wait_until(lambda: _legacy_charges(engine) == 1, what="the charge applied")
    pg_proxy.shut_for(outage, cut=True)
    signalled = time.monotonic()
    s.signal("worker-1", signal.SIGTERM)

    code = s.procs["worker-1"].wait(timeout=GRACE + outage + 15)
    exited_after = time.monotonic() - signalled
    assert code == 0
    assert exited_after > outage - 1, f"the worker left {exited_after:.1f} s after SIGTERM"
    # Committed by that worker, before the lease ran out: no takeover, one charge.
    assert scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=ref) == "succeeded"
    result = only_result(producer, turn_id, timeout=20)
    assert result.status == "succeeded", result
    assert _legacy_charges(engine) == 1


def _legacy_charges(engine: Engine) -> int:
    return int(
        scalar(engine, "SELECT count(*) FROM downstream.side_effects WHERE service = 'legacy'")
    )
