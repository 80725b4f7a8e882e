"""Holes in the two promises, each shown with real worker, relayer and sweeper processes.

Every proposed call ends in exactly one terminal result; every logical write takes effect
downstream at most once. Each test injects a real failure (SIGKILL, a lost Redis, a
terminated Postgres backend, a deploy during a crash gap, an RQ job timeout) and then
counts: downstream side effects, reservations, the call's terminal state.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.acceptance.conftest import (
    REFUND_O17,
    SUPPORT_A,
    effects_for,
    requests_for,
    scalar,
    trace_events,
    wait_until,
)
from tests.acceptance.private_stack import (
    code_of,
    database_url,
    dispatches,
    env,
    key_of,
    make_producer,
    only_result,
    start,
    submit_one,
    worker_without_delay,
)
from tests.acceptance.processes import private_redis, terminate_backends

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures, for pytest

# --- hole 1: an expired lease is re-dispatched until someone takes it ---------------------


def test_expired_lease_is_redispatched_again_after_its_job_is_lost(
    start, make_producer, engine, fresh_payments, private_redis
):
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS="refund_payment=0:60000")
    producer = make_producer()
    turn_id, ref, op = submit_one(producer, "refund_payment", REFUND_O17)
    key = key_of(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the refund to apply")
    s.signal("worker-1", signal.SIGKILL)  # dies in the crash gap: the call stays started
    s.procs["worker-1"].wait()
    wait_until(lambda: dispatches(engine, ref) >= 2, what="the sweeper to re-dispatch")
    private_redis.flush()  # that job is lost too
    wait_until(lambda: dispatches(engine, ref) >= 3, what="a second re-dispatch", timeout=10)
    worker_without_delay(s, "worker-2")

    result = only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert effects_for(engine, key) == 1


# --- hole 2: a sweep that cannot enqueue marks nothing -----------------------------------


def test_sweep_with_redis_down_marks_nothing_and_dispatches_once_redis_is_back(
    start, make_producer, engine, private_redis
):
    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "get_stock", {"symbol": "NVDA"})
    private_redis.kill()  # Redis is down, and the job it held is gone
    s = start(workers=0, relayer=False, sweeper=True)
    time.sleep(3)  # the call is due (stale after 1 s); every sweep fails to enqueue
    assert dispatches(engine, ref) == 1
    assert s.alive() == ["sweeper"]

    private_redis.start()  # back, empty
    s.start_worker("worker-1")
    s.start("relayer", ["relayer"])
    result = only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert dispatches(engine, ref) >= 2
    assert len(trace_events(engine, ref, "completed")) == 1


# --- hole 3: an intent that changed during a crash gap ends the call ----------------------


def test_tool_version_bump_during_crash_gap_ends_in_reconciliation(
    start, make_producer, engine, fresh_payments
):
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS="refund_payment=0:60000")
    producer = make_producer()
    turn_id, _ref, op = submit_one(producer, "refund_payment", REFUND_O17)
    key = key_of(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the refund to apply")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    worker_without_delay(s, "worker-v2", CALLGATE_TOOLS="tests.acceptance.legacy_tools:registry_v2")

    result = only_result(producer, turn_id)
    assert (result.status, code_of(result)) == ("failed_terminal", "reconciliation_pending")
    assert effects_for(engine, key) == 1
    assert scalar(
        engine, "SELECT state FROM callgate.operations WHERE operation_id = :o", o=op
    ) == ("failed")


# --- hole 4: a completion that fails on a dead connection is retried ----------------------


def test_completion_on_a_terminated_backend_is_retried_not_lost(start, make_producer, engine):
    start(workers=1, CALLGATE_DEMO_DELAY_MS="charge_legacy=0:1500", CALLGATE_LEASE_SECONDS="10")
    producer = make_producer()
    turn_id, ref, op = submit_one(producer, "charge_legacy", {"amount": 5})
    key = key_of(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the charge to apply")
    assert terminate_backends(engine, "callgate-worker") >= 1

    result = only_result(producer, turn_id)
    assert result.status == "succeeded"  # the result in hand was committed, not dropped
    assert effects_for(engine, key) == 1
    assert trace_events(engine, ref, "takeover") == []


# --- holes 5 and 6: an unguarded write that may have applied is never sent again ----------


def test_unguarded_write_that_timed_out_is_not_retried_nor_rerun_by_a_later_turn(
    start, make_producer, engine
):
    start(workers=1, CALLGATE_TEST_LEGACY_RESPONSE_TIMEOUT="1")
    producer = make_producer()
    turn_id, _ref, op = submit_one(producer, "charge_legacy", {"amount": 5})
    key = key_of(engine, op)
    result = only_result(producer, turn_id)
    assert requests_for(engine, key) == 1  # sent once: no in-process retry
    assert effects_for(engine, key) == 1
    assert (result.status, code_of(result)) == ("failed_terminal", "reconciliation_pending")

    # A later turn retrying the same logical write with the operation id gets that outcome.
    again, _ref2, _ = submit_one(
        producer, "charge_legacy", {"amount": 5}, call_id="c2", operation_id=op
    )
    second = only_result(producer, again)
    assert code_of(second) == "reconciliation_pending"
    assert requests_for(engine, key) == 1
    assert effects_for(engine, key) == 1


# --- hole 7: fencing alone does not make a takeover safe ----------------------------------


def test_fenced_only_write_is_not_taken_over_after_a_crash_gap(start, make_producer, engine):
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS="charge_fenced=0:60000")
    producer = make_producer()
    turn_id, _ref, op = submit_one(producer, "charge_fenced", {"amount": 7})
    key = key_of(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="generation 1's charge")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    worker_without_delay(s, "worker-2")

    result = only_result(producer, turn_id)
    assert (result.status, code_of(result)) == ("failed_terminal", "reconciliation_pending")
    assert effects_for(engine, key) == 1
    assert requests_for(engine, key) == 1


# --- hole 8: an unknown outcome of a write is not a failure -------------------------------


def test_an_exception_after_a_write_applied_goes_to_reconciliation(start, make_producer, engine):
    start(
        workers=1,
        CALLGATE_DEMO_DELAY_MS="charge_legacy=0:1500",
        CALLGATE_TEST_LEGACY_RECEIPT="1",
        CALLGATE_LEASE_SECONDS="10",
    )
    producer = make_producer()
    turn_id, _ref, op = submit_one(producer, "charge_legacy", {"amount": 9})
    key = key_of(engine, op)
    wait_until(lambda: effects_for(engine, key) == 1, what="the charge to apply")
    # The gateway connection dies: the handler's next statement raises the driver's error.
    assert terminate_backends(engine, "callgate-downstream") >= 1
    result = only_result(producer, turn_id)
    assert (result.status, code_of(result)) == ("failed_terminal", "reconciliation_pending")
    assert effects_for(engine, key) == 1


def test_a_write_hung_past_the_job_timeout_lets_its_call_be_taken_over(
    start, make_producer, engine, fresh_payments
):
    s = start(
        workers=1,
        CALLGATE_DEMO_DELAY_MS="refund_payment=600000:0",
        CALLGATE_JOB_TIMEOUT_SECONDS="1",
        CALLGATE_WORKER_CONCURRENCY="1",  # the hung worker takes nothing else meanwhile
    )
    producer = make_producer()
    turn_id, ref, op = submit_one(producer, "refund_payment", REFUND_O17)
    wait_until(lambda: trace_events(engine, ref, "reserved"), what="the hung refund to start")
    worker_without_delay(s, "worker-2")
    result = only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert [e["generation"] for e in trace_events(engine, ref, "takeover")] == [2]
    assert requests_for(engine, key_of(engine, op)) == 1


def test_a_read_hung_past_the_job_timeout_is_dispatched_again(start, make_producer, engine):
    # A read has no lease to let go: a sweep finds its job still taken by a live worker
    # longer than the job timeout ago, and dispatches it again.
    s = start(
        workers=1,
        CALLGATE_DEMO_DELAY_MS="get_stock=600000",
        CALLGATE_JOB_TIMEOUT_SECONDS="1",
        CALLGATE_WORKER_CONCURRENCY="1",
    )
    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "get_stock", {"symbol": "NVDA"})
    wait_until(lambda: dispatches(engine, ref) >= 2, what="the hung read's second dispatch")
    worker_without_delay(s, "worker-2")
    result = only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert len(trace_events(engine, ref, "completed")) == 1
    assert trace_events(engine, ref, "reserved") == []


# --- hole 11: a result Postgres cannot store still ends the call --------------------------


def test_result_with_a_nul_character_still_ends_the_call(start, make_producer, engine):
    start(workers=1)
    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "echo_text", {"text": "hello"})
    result = only_result(producer, turn_id, timeout=15)
    assert result.status == "succeeded"
    assert "\x00" not in result.data["content"]["text"]
    assert dispatches(engine, ref) == 1


def test_a_call_that_kills_every_worker_ends_after_its_dispatch_budget(
    start, make_producer, engine
):
    s = start(workers=3, CALLGATE_MAX_DISPATCHES="3")
    producer = make_producer()
    turn_id, ref, _op = submit_one(producer, "crash_worker", {"text": "boom"})
    result = only_result(producer, turn_id, timeout=30)
    assert (result.status, code_of(result)) == ("failed_terminal", "delivery_exhausted")
    assert dispatches(engine, ref) == 3
    # Each dispatch ran the handler: each killed the worker that took it.
    assert [name for name in s.alive() if name.startswith("worker")] == []


# --- hole 17: the heartbeat keeps a long handler's lease ----------------------------------


def test_heartbeat_keeps_the_lease_of_a_handler_running_many_leases_long(
    start, make_producer, engine, fresh_payments
):
    start(workers=2, CALLGATE_DEMO_DELAY_MS="refund_payment=0:4000")  # 1 s lease
    producer = make_producer()
    turn_id, ref, op = submit_one(producer, "refund_payment", REFUND_O17)
    result = only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert trace_events(engine, ref, "takeover") == []
    assert len(trace_events(engine, ref, "reserved")) == 1
    assert requests_for(engine, key_of(engine, op)) == 1


# --- hole 12, across turns: a call waiting on a busy operation id is not handed its result -


def test_a_waiting_call_on_a_busy_operation_id_with_other_arguments_gets_a_conflict(
    start, make_producer, engine, fresh_payments
):
    start(workers=2, CALLGATE_DEMO_DELAY_MS="refund_payment=0:1500,send_email=0:3000")
    producer = make_producer()
    one_krw = {"order_id": "O-17", "amount": 1, "currency": "KRW"}
    first, ref, op = submit_one(producer, "refund_payment", one_krw)
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
    assert only_result(producer, first).status == "succeeded"
    collected = producer.collect(later.turn_id, timeout=20)
    assert collected.complete
    two = {r.call_id: r for r in collected.results}["two"]
    assert (two.status, code_of(two)) == ("failed_terminal", "idempotency_conflict")
    assert effects_for(engine, key_of(engine, op)) == 1
    assert scalar(engine, "SELECT refunded FROM downstream.payments WHERE order_id = 'O-17'") == 1


# --- holes 7 and 8: a status lookup settles what a crash gap left unknown -----------------


@pytest.mark.parametrize("died", ["after_write", "before_write"])
def test_a_status_lookup_settles_a_takeover_of_an_unkeyed_write(start, make_producer, engine, died):
    delay = "charge_lookup=0:60000" if died == "after_write" else "charge_lookup=60000:0"
    s = start(workers=1, CALLGATE_DEMO_DELAY_MS=delay)
    producer = make_producer()
    turn_id, ref, op = submit_one(producer, "charge_lookup", {"amount": 3})
    key = key_of(engine, op)
    if died == "after_write":
        wait_until(lambda: effects_for(engine, key) == 1, what="the charge to apply")
    else:
        wait_until(lambda: trace_events(engine, ref, "reserved"), what="the reservation")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    worker_without_delay(s, "worker-2")

    result = only_result(producer, turn_id)
    assert result.status == "succeeded"
    assert effects_for(engine, key) == 1
    # Sent once: the lookup found the first charge, or showed there was none to repeat.
    assert requests_for(engine, key) == 1
    assert result.data["content"].get("found_by_lookup") is (died == "after_write") or (
        died == "before_write" and "found_by_lookup" not in result.data["content"]
    )
