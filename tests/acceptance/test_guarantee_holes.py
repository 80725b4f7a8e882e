"""Holes in the two promises, each shown with real worker, relayer and sweeper processes.

Every proposed call ends in exactly one terminal result; every logical write takes effect
downstream at most once. Each test injects a real failure (SIGKILL, a lost Redis, a
terminated Postgres backend, a deploy during a crash gap, an RQ job timeout) and then
counts: downstream side effects, reservations, the call's terminal state.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from ops.stack import Stack, wait_for_workers
from producer import Producer
from store import db, transport
from store.settings import Settings
from tests.acceptance import legacy_tools
from tests.acceptance.conftest import (
    REFUND_O17,
    SUPPORT_A,
    effects_for,
    requests_for,
    scalar,
    trace_events,
    wait_until,
)
from tests.acceptance.processes import PrivateRedis, private_redis, terminate_backends

__all__ = ["private_redis"]  # the fixture, re-exported for pytest

LEGACY = "tests.acceptance.legacy_tools:registry"
FAST = {
    "CALLGATE_LEASE_SECONDS": "1",
    "CALLGATE_SWEEP_SECONDS": "0.2",
    "CALLGATE_STALE_SECONDS": "1",
}
NO_DELAY = {"CALLGATE_DEMO_DELAY_MS": ""}


@pytest.fixture
def env(database_url: str, private_redis: PrivateRedis, queue_name: str) -> dict[str, str]:
    return {
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_REDIS_URL": private_redis.url,
        "CALLGATE_QUEUE": queue_name,
        "CALLGATE_TOOLS": LEGACY,
        **FAST,
    }


@pytest.fixture
def start(env: dict[str, str]) -> Iterator[Callable[..., Stack]]:
    started: list[Stack] = []

    def start_(*, workers: int = 1, relayer: bool = True, sweeper: bool = True, **extra: str):
        s = Stack(env={**env, **extra}, workers=workers, relayer=relayer, sweeper=sweeper)
        s.__enter__()
        started.append(s)
        if workers:
            wait_for_workers(env["CALLGATE_REDIS_URL"], env["CALLGATE_QUEUE"], workers)
        return s

    yield start_
    for s in started:
        s.stop()


@pytest.fixture
def make_producer(env: dict[str, str]) -> Iterator[Callable[..., Producer]]:
    made: list[Producer] = []

    def make(**extra: str) -> Producer:
        settings = Settings.from_env({**env, **extra})
        p = Producer(
            settings=settings,
            engine=db.create(settings.require_database()),
            redis_connection=transport.connect(settings.require_redis()),
            registry=legacy_tools.registry(),
        )
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _submit(
    producer: Producer,
    tool: str,
    arguments: dict[str, Any],
    *,
    call_id: str = "c1",
    operation_id: str | None = None,
) -> tuple[str, str, str]:
    turn = producer.submit(
        [{"call_id": call_id, "tool_name": tool, "arguments": arguments}],
        SUPPORT_A,
        operation_ids={call_id: operation_id} if operation_id else None,
    )
    (call,) = turn.calls
    return turn.turn_id, call.ref, call.operation_id


def _key(engine: Engine, operation_id: str) -> str:
    return str(
        scalar(
            engine,
            "SELECT idempotency_key FROM callgate.operations WHERE operation_id = :o",
            o=operation_id,
        )
    )


def _dispatches(engine: Engine, ref: str) -> int:
    return int(scalar(engine, "SELECT dispatches FROM callgate.calls WHERE id = :r", r=ref))


def _only_result(producer: Producer, turn_id: str, timeout: float = 20) -> Any:
    collected = producer.collect(turn_id, timeout=timeout)
    assert collected.complete, f"the call did not end: pending {collected.pending}"
    (result,) = collected.results
    return result


def _code(result: Any) -> str:
    return str(result.error.code)


def _worker_without_delay(s: Stack, name: str, **env: str) -> None:
    s.start(
        name,
        ["worker", "--name", f"{name}-{os.getpid()}-{time.monotonic_ns()}"],
        env={
            **NO_DELAY,
            **env,
        },
    )


# --- hole 1: an expired lease is re-dispatched until someone takes it ---------------------


def test_expired_lease_is_redispatched_again_after_its_job_is_lost(
    start, make_producer, engine, fresh_payments, private_redis
):
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS="refund_payment=0:60000")
    producer = make_producer()
    turn_id, ref, op = _submit(producer, "refund_payment", REFUND_O17)
    key = _key(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the refund to apply")
    s.signal("worker-1", signal.SIGKILL)  # dies in the crash gap: the call stays started
    s.procs["worker-1"].wait()
    wait_until(lambda: _dispatches(engine, ref) >= 2, what="the sweeper to re-dispatch")
    private_redis.flush()  # that job is lost too
    wait_until(lambda: _dispatches(engine, ref) >= 3, what="a second re-dispatch", timeout=10)
    _worker_without_delay(s, "worker-2")

    result = _only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert effects_for(engine, key) == 1


# --- hole 2: a sweep that cannot enqueue marks nothing -----------------------------------


def test_sweep_with_redis_down_marks_nothing_and_dispatches_once_redis_is_back(
    start, make_producer, engine, private_redis
):
    producer = make_producer()
    turn_id, ref, _op = _submit(producer, "get_stock", {"symbol": "NVDA"})
    private_redis.kill()  # Redis is down, and the job it held is gone
    s = start(workers=0, relayer=False, sweeper=True)
    time.sleep(3)  # the call is due (stale after 1 s); every sweep fails to enqueue
    assert _dispatches(engine, ref) == 1
    assert s.alive() == ["sweeper"]

    private_redis.start()  # back, empty
    s.start_worker("worker-1")
    s.start("relayer", ["relayer"])
    result = _only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert _dispatches(engine, ref) >= 2
    assert len(trace_events(engine, ref, "reserved")) == 1


# --- hole 3: an intent that changed during a crash gap ends the call ----------------------


def test_tool_version_bump_during_crash_gap_ends_in_reconciliation(
    start, make_producer, engine, fresh_payments
):
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS="refund_payment=0:60000")
    producer = make_producer()
    turn_id, _ref, op = _submit(producer, "refund_payment", REFUND_O17)
    key = _key(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the refund to apply")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    _worker_without_delay(
        s, "worker-v2", CALLGATE_TOOLS="tests.acceptance.legacy_tools:registry_v2"
    )

    result = _only_result(producer, turn_id)
    assert (result.status, _code(result)) == ("failed_terminal", "reconciliation_pending")
    assert effects_for(engine, key) == 1
    assert scalar(
        engine, "SELECT state FROM callgate.operations WHERE operation_id = :o", o=op
    ) == ("failed")


# --- hole 4: a completion that fails on a dead connection is retried ----------------------


def test_completion_on_a_terminated_backend_is_retried_not_lost(start, make_producer, engine):
    start(workers=1, CALLGATE_DEMO_DELAY_MS="charge_legacy=0:1500", CALLGATE_LEASE_SECONDS="10")
    producer = make_producer()
    turn_id, ref, op = _submit(producer, "charge_legacy", {"amount": 5})
    key = _key(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the charge to apply")
    assert terminate_backends(engine, "callgate-worker") >= 1

    result = _only_result(producer, turn_id)
    assert result.status == "succeeded"  # the result in hand was committed, not dropped
    assert effects_for(engine, key) == 1
    assert trace_events(engine, ref, "takeover") == []


# --- holes 5 and 6: an unguarded write that may have applied is never sent again ----------


def test_unguarded_write_that_timed_out_is_not_retried_nor_rerun_by_a_later_turn(
    start, make_producer, engine
):
    start(workers=1, CALLGATE_TEST_LEGACY_RESPONSE_TIMEOUT="1")
    producer = make_producer()
    turn_id, _ref, op = _submit(producer, "charge_legacy", {"amount": 5})
    key = _key(engine, op)
    result = _only_result(producer, turn_id)
    assert requests_for(engine, key) == 1  # sent once: no in-process retry
    assert effects_for(engine, key) == 1
    assert (result.status, _code(result)) == ("failed_terminal", "reconciliation_pending")

    # A later turn retrying the same logical write with the operation id gets that outcome.
    again, _ref2, _ = _submit(
        producer, "charge_legacy", {"amount": 5}, call_id="c2", operation_id=op
    )
    second = _only_result(producer, again)
    assert _code(second) == "reconciliation_pending"
    assert requests_for(engine, key) == 1
    assert effects_for(engine, key) == 1


# --- hole 7: fencing alone does not make a takeover safe ----------------------------------


def test_fenced_only_write_is_not_taken_over_after_a_crash_gap(start, make_producer, engine):
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS="charge_fenced=0:60000")
    producer = make_producer()
    turn_id, _ref, op = _submit(producer, "charge_fenced", {"amount": 7})
    key = _key(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="generation 1's charge")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    _worker_without_delay(s, "worker-2")

    result = _only_result(producer, turn_id)
    assert (result.status, _code(result)) == ("failed_terminal", "reconciliation_pending")
    assert effects_for(engine, key) == 1
    assert requests_for(engine, key) == 1


# --- hole 8: an unknown outcome of a write is not a failure -------------------------------


def test_job_timeout_after_a_write_goes_to_reconciliation(start, make_producer, engine):
    start(workers=1, CALLGATE_DEMO_DELAY_MS="charge_legacy=0:4000", CALLGATE_LEASE_SECONDS="10")
    producer = make_producer(CALLGATE_JOB_TIMEOUT_SECONDS="1")  # RQ's SIGALRM job timeout
    turn_id, _ref, op = _submit(producer, "charge_legacy", {"amount": 9})
    key = _key(engine, op)
    result = _only_result(producer, turn_id)
    assert (result.status, _code(result)) == ("failed_terminal", "reconciliation_pending")
    assert effects_for(engine, key) == 1


# --- hole 11: a result Postgres cannot store still ends the call --------------------------


def test_result_with_a_nul_character_still_ends_the_call(start, make_producer, engine):
    start(workers=1)
    producer = make_producer()
    turn_id, ref, _op = _submit(producer, "echo_text", {"text": "hello"})
    result = _only_result(producer, turn_id, timeout=15)
    assert result.status == "succeeded"
    assert "\x00" not in result.data["content"]["text"]
    assert _dispatches(engine, ref) == 1


def test_a_call_that_kills_every_worker_ends_after_its_dispatch_budget(
    start, make_producer, engine
):
    start(workers=3, CALLGATE_MAX_DISPATCHES="3")
    producer = make_producer()
    turn_id, ref, _op = _submit(producer, "crash_worker", {"text": "boom"})
    result = _only_result(producer, turn_id, timeout=30)
    assert (result.status, _code(result)) == ("failed_terminal", "delivery_exhausted")
    assert _dispatches(engine, ref) == 3
    assert (
        len(trace_events(engine, ref, "reserved")) + len(trace_events(engine, ref, "takeover")) == 3
    )


# --- hole 17: the heartbeat keeps a long handler's lease ----------------------------------


def test_heartbeat_keeps_the_lease_of_a_handler_running_many_leases_long(
    start, make_producer, engine, fresh_payments
):
    start(workers=2, CALLGATE_DEMO_DELAY_MS="refund_payment=0:4000")  # 1 s lease
    producer = make_producer()
    turn_id, ref, op = _submit(producer, "refund_payment", REFUND_O17)
    result = _only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert trace_events(engine, ref, "takeover") == []
    assert len(trace_events(engine, ref, "reserved")) == 1
    assert requests_for(engine, _key(engine, op)) == 1


# --- hole 12, across turns: a call waiting on a busy operation id is not handed its result -


def test_a_waiting_call_on_a_busy_operation_id_with_other_arguments_gets_a_conflict(
    start, make_producer, engine, fresh_payments
):
    start(workers=2, CALLGATE_DEMO_DELAY_MS="refund_payment=0:1500,send_email=0:3000")
    producer = make_producer()
    one_krw = {"order_id": "O-17", "amount": 1, "currency": "KRW"}
    first, ref, op = _submit(producer, "refund_payment", one_krw)
    wait_until(lambda: trace_events(engine, ref, "reserved"), what="the first refund to start")
    # A later turn reuses the operation id for a 2 KRW refund, queued behind a slow e-mail:
    # it is still waiting when the 1 KRW refund completes.
    later = producer.submit(
        [
            {
                "call_id": "mail",
                "tool_name": "send_email",
                "arguments": {"to": "a@b.c", "template": "t"},
            },
            {
                "call_id": "two",
                "tool_name": "refund_payment",
                "arguments": {**one_krw, "amount": 2},
            },
        ],
        SUPPORT_A,
        operation_ids={"two": op},
    )
    assert _only_result(producer, first).status == "succeeded"
    collected = producer.collect(later.turn_id, timeout=20)
    assert collected.complete
    two = {r.call_id: r for r in collected.results}["two"]
    assert (two.status, _code(two)) == ("failed_terminal", "idempotency_conflict")
    assert effects_for(engine, _key(engine, op)) == 1
    assert scalar(engine, "SELECT refunded FROM downstream.payments WHERE order_id = 'O-17'") == 1


# --- holes 7 and 8: a status lookup settles what a crash gap left unknown -----------------


@pytest.mark.parametrize("died", ["after_write", "before_write"])
def test_a_status_lookup_settles_a_takeover_of_an_unkeyed_write(start, make_producer, engine, died):
    delay = "charge_lookup=0:60000" if died == "after_write" else "charge_lookup=60000:0"
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS=delay)
    producer = make_producer()
    turn_id, ref, op = _submit(producer, "charge_lookup", {"amount": 3})
    key = _key(engine, op)
    if died == "after_write":
        wait_until(lambda: effects_for(engine, key) == 1, what="the charge to apply")
    else:
        wait_until(lambda: trace_events(engine, ref, "reserved"), what="the reservation")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    _worker_without_delay(s, "worker-2")

    result = _only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert effects_for(engine, key) == 1
    # Sent once: the lookup found the first charge, or showed there was none to repeat.
    assert requests_for(engine, key) == 1
    assert result.data["content"].get("found_by_lookup") is (died == "after_write") or (
        died == "before_write" and "found_by_lookup" not in result.data["content"]
    )
