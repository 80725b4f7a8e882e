"""Many calls in flight in one worker process, each with its own lease, fence and
completion: they overlap (read from their trace timestamps), a SIGKILL loses none and
duplicates no side effect, SIGTERM drains, and sync and async handlers both run."""

from __future__ import annotations

import signal
from typing import Any

import redis
from sqlalchemy import Engine, text

from callgate.producer import Producer
from callgate.queue import deliveries
from tests.acceptance.conftest import (
    SUPPORT_A,
    effects_for,
    handler_intervals,
    requests_for,
    scalar,
    wait_until,
)
from tests.acceptance.private_stack import (
    database_url,
    env,
    key_of,
    make_producer,
    start,
    worker_without_delay,
)
from tests.acceptance.processes import private_redis

__all__ = ["database_url", "env", "make_producer", "private_redis", "start"]  # fixtures, for pytest

K = 8


def _submit_each(producer: Producer, tool: str, args: list[dict[str, Any]]) -> list[Any]:
    """One turn per call, so writes are not ordered behind each other."""
    turns = []
    for i, a in enumerate(args):
        turns.append(
            producer.submit([{"call_id": f"c{i}", "tool_name": tool, "arguments": a}], SUPPORT_A)
        )
    return turns


def _intervals(engine: Engine, refs: list[str]) -> list[tuple[Any, Any]]:
    """Each call's [started, completed] interval, from Postgres' own timestamps."""
    return list(handler_intervals(engine, refs).values())


def _all_succeeded(producer: Producer, turns: list[Any]) -> None:
    for turn in turns:
        collected = producer.collect(turn.turn_id, timeout=30)
        assert collected.complete, collected.pending
        assert [r.status for r in collected.results] == ["succeeded"]


def _refs(turns: list[Any]) -> list[str]:
    return [t.calls[0].ref for t in turns]


def test_one_worker_runs_k_calls_at_once(start, make_producer, engine):
    start(workers=1, CALLGATE_WORKER_CONCURRENCY=str(K), CALLGATE_DEMO_DELAY_MS="get_stock=700")
    producer = make_producer()
    turns = _submit_each(producer, "get_stock", [{"symbol": f"S{i}"} for i in range(K)])
    _all_succeeded(producer, turns)
    intervals = _intervals(engine, _refs(turns))
    assert len(intervals) == K
    # All K were running at one moment: the last to start started before the first ended.
    assert max(s for s, _ in intervals) < min(e for _, e in intervals)


def test_sync_and_async_handlers_both_run_and_overlap(start, make_producer, engine):
    start(workers=1, CALLGATE_WORKER_CONCURRENCY=str(K), CALLGATE_TEST_ASYNC_SECONDS="0.7")
    producer = make_producer()
    async_turns = _submit_each(producer, "echo_later", [{"text": f"t{i}"} for i in range(K)])
    sync_turns = _submit_each(producer, "echo_text", [{"text": "plain"}])
    _all_succeeded(producer, async_turns + sync_turns)
    collected = producer.collect(async_turns[0].turn_id, timeout=5)
    assert collected.results[0].data["content"] == {"text": "t0", "note": "async"}
    intervals = _intervals(engine, _refs(async_turns))
    assert max(s for s, _ in intervals) < min(e for _, e in intervals)


def test_sigkill_with_k_writes_in_flight_loses_none_and_duplicates_none(
    start, make_producer, engine
):
    s = start(
        workers=1,
        CALLGATE_WORKER_CONCURRENCY=str(K),
        CALLGATE_DEMO_DELAY_MS="send_email=0:60000",  # each stalls after its write
    )
    producer = make_producer()
    turns = _submit_each(
        producer, "send_email", [{"to": f"u{i}@x.test", "template": "hi"} for i in range(K)]
    )
    keys = [key_of(engine, t.calls[0].operation_id) for t in turns]
    wait_until(lambda: all(effects_for(engine, k) == 1 for k in keys), what=f"{K} writes in flight")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    worker_without_delay(s, "worker-2", CALLGATE_WORKER_CONCURRENCY=str(K))

    _all_succeeded(producer, turns)
    assert [effects_for(engine, k) for k in keys] == [1] * K
    assert [requests_for(engine, k) for k in keys] == [2] * K  # sent twice, applied once


def test_sigkill_with_write_completions_buffered_loses_none_and_duplicates_none(
    start, make_producer, engine
):
    """A write whose handler returned waits in its process's batch for the write still
    running beside it (a long commit window); SIGKILL then. Neither completion was sent:
    both writes are taken over, sent again with their keys, and applied once."""
    s = start(
        workers=1,
        CALLGATE_WORKER_CONCURRENCY="2",
        CALLGATE_WORKER_COMMIT_WINDOW_MS="30000",
        CALLGATE_DEMO_DELAY_MS="refund_payment=0:60000",  # stalls after its write
    )
    producer = make_producer()
    (slow,) = _submit_each(
        producer, "refund_payment", [{"order_id": "O-17", "amount": 1000, "currency": "KRW"}]
    )
    slow_key = key_of(engine, slow.calls[0].operation_id)
    wait_until(lambda: effects_for(engine, slow_key) == 1, what="the slow write applied")
    (fast,) = _submit_each(producer, "send_email", [{"to": "u@x.test", "template": "hi"}])
    fast_key = key_of(engine, fast.calls[0].operation_id)
    wait_until(lambda: effects_for(engine, fast_key) == 1, what="the fast write applied")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    # Its handler had returned; its completion was still in the batch, never sent.
    assert _ended(engine, _refs([slow, fast])) == []
    worker_without_delay(s, "worker-2")

    _all_succeeded(producer, [slow, fast])
    assert [effects_for(engine, k) for k in (slow_key, fast_key)] == [1, 1]
    assert [requests_for(engine, k) for k in (slow_key, fast_key)] == [2, 2]  # applied once


def test_a_slot_goes_to_the_next_call_while_an_ending_commits(start, make_producer, engine):
    """K = 1: the first read's ending is held on a row lock after its handler returned; the
    second read is taken, runs and ends meanwhile. (Before, the slot stayed with the first
    read until its ending committed, and the second waited for the lock's release.)"""
    start(
        workers=1,
        sweeper=False,
        CALLGATE_WORKER_CONCURRENCY="1",
        CALLGATE_DEMO_DELAY_MS="get_stock=1000",
    )
    producer = make_producer()
    (first,) = _submit_each(producer, "get_stock", [{"symbol": "FIRST"}])
    state = "SELECT state FROM callgate.calls WHERE id = :r"
    with engine.connect() as holder:
        holder.execute(
            text("SELECT state FROM callgate.calls WHERE id = :r FOR UPDATE"),
            {"r": first.calls[0].ref},
        )
        assert scalar(engine, state, r=first.calls[0].ref) == "proposed"  # still running
        # The first read's ending waits for this lock (its handler has returned).
        wait_until(
            lambda: scalar(
                engine,
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%jsonb_to_recordset%' AND datname = current_database()",
            ),
            what="the first read's ending waiting on the row lock",
        )
        (second,) = _submit_each(producer, "get_stock", [{"symbol": "SECOND"}])
        wait_until(
            lambda: scalar(engine, state, r=second.calls[0].ref) == "succeeded",
            what="the second read to end while the first read's ending waits",
        )
        assert scalar(engine, state, r=first.calls[0].ref) == "proposed"
        holder.rollback()
    _all_succeeded(producer, [first, second])


def test_sigterm_finishes_the_calls_in_flight_and_takes_no_more(start, make_producer, engine, env):
    s = start(
        workers=1,
        CALLGATE_WORKER_CONCURRENCY="4",
        CALLGATE_DEMO_DELAY_MS="get_stock=1500",
        CALLGATE_LEASE_SECONDS="30",
    )
    producer = make_producer()
    first = _submit_each(producer, "get_stock", [{"symbol": f"S{i}"} for i in range(4)])
    wait_until(lambda: len(_started(engine, env, _refs(first))) == 4, what="4 calls in flight")
    s.signal("worker-1", signal.SIGTERM)
    later = _submit_each(producer, "get_stock", [{"symbol": "LATE"}])
    assert s.procs["worker-1"].wait(timeout=20) == 0
    _all_succeeded(producer, first)
    assert _started(engine, env, _refs(later)) == []  # the draining worker took no new call
    worker_without_delay(s, "worker-2")
    _all_succeeded(producer, later)


def _started(engine: Engine, env: dict[str, str], refs: list[str]) -> list[str]:
    """The calls among ``refs`` a worker took (a read takes no reservation: its worker's
    taken hash lists it while it runs) or that ended."""
    conn = redis.Redis.from_url(env["CALLGATE_REDIS_URL"])
    queue = env["CALLGATE_QUEUE"]
    taken: set[str] = set()
    for raw in conn.smembers(deliveries.workers_key(queue)):  # type: ignore[union-attr]
        key = deliveries.taken_key(queue, raw.decode())
        held: dict[bytes, bytes] = conn.hgetall(key)  # type: ignore[assignment]
        taken |= {str(deliveries.call_ref(v)) for v in held.values()}
    return sorted((taken & set(refs)) | set(_ended(engine, refs)))


def _ended(engine: Engine, refs: list[str]) -> list[str]:
    with engine.connect() as conn:
        return [
            str(r[0])
            for r in conn.execute(
                text(
                    "SELECT id FROM callgate.calls"
                    " WHERE id = ANY(CAST(:refs AS uuid[])) AND completed_at IS NOT NULL"
                ),
                {"refs": refs},
            )
        ]


def test_a_worker_outlives_a_redis_restart(start, make_producer, engine, private_redis):
    s = start(workers=1)
    private_redis.kill()  # Redis is gone while the worker waits for calls
    private_redis.start()  # back, empty
    producer = make_producer()
    (turn,) = _submit_each(producer, "get_stock", [{"symbol": "AFTER"}])
    _all_succeeded(producer, [turn])
    assert s.procs["worker-1"].poll() is None  # the same worker took it, still running
