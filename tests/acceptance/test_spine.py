"""The spine's promises, shown with real worker, relayer and sweeper processes.

Each test counts effects: rows of ``downstream.side_effects``, outbox rows, trace events.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine

from callgate.producer import Producer
from callgate.producer.fanin import FanIn
from callgate.queue import transport
from tests.acceptance.conftest import (
    REFUND_O17,
    SUPPORT_A,
    handler_intervals,
    scalar,
    side_effects,
    trace_events,
    wait_until,
)
from tests.pgbouncer import PgBouncer


@pytest.fixture(params=["direct", "pgbouncer"])
def service_env(
    request: pytest.FixtureRequest, service_env: dict[str, str], pgbouncer: PgBouncer
) -> dict[str, str]:
    """Every promise here holds with PostgreSQL reached directly and through PgBouncer in
    transaction mode (``?pgbouncer=true``), as a deployment past a few hosts runs it."""
    if request.param == "direct":
        return service_env
    url = pgbouncer.url_for(service_env["CALLGATE_DATABASE_URL"])
    return {**service_env, "CALLGATE_DATABASE_URL": url}


FAST_RECOVERY = {
    "CALLGATE_LEASE_SECONDS": "1",
    "CALLGATE_SWEEP_SECONDS": "0.2",
}


def _refund(producer: Producer, call_id: str = "call-refund-3") -> tuple[str, str, str]:
    turn = producer.submit(
        [{"call_id": call_id, "tool_name": "refund_payment", "arguments": REFUND_O17}], SUPPORT_A
    )
    call = turn.calls[0]
    return turn.turn_id, call.ref, call.operation_id


def _refund_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        from sqlalchemy import text

        return [r[0] for r in conn.execute(text("SELECT refund_id FROM downstream.refunds"))]


def _execution_intervals(engine: Engine, turn_id: str) -> dict[str, tuple[Any, Any]]:
    """Per call: when its handler started and when its completion committed, from
    Postgres' own timestamps (a reservation's, or a read's audit on its call row)."""
    with engine.connect() as conn:
        from sqlalchemy import text

        rows = conn.execute(
            text("SELECT CAST(id AS text) AS ref, call_id FROM callgate.calls WHERE turn_id = :t"),
            {"t": turn_id},
        ).all()
    by_ref = {r.ref: r.call_id for r in rows}
    intervals = handler_intervals(engine, list(by_ref))
    return {by_ref[ref]: interval for ref, interval in intervals.items()}


def test_a_parallel_reads_run_concurrently_and_join_by_id(producer, stack, engine):
    """Concurrency and completion order come from the trace's own timestamps, never from a
    wall-clock threshold: all three reads were executing at one moment when the latest
    reservation precedes the earliest completion. A loaded machine may delay a worker's
    pickup in one turn, so several turns are sampled; a sequential executor never overlaps.
    The elapsed time is printed as a figure, not asserted."""
    stack(workers=3, CALLGATE_DEMO_DELAY_MS="get_weather=120,get_stock=280,get_news=200")
    proposals = [
        {
            "call_id": "call-A",
            "tool_name": "get_weather",
            "arguments": {"city": "Seoul", "unit": "celsius"},
        },
        {"call_id": "call-B", "tool_name": "get_stock", "arguments": {"symbol": "NVDA"}},
        {"call_id": "call-C", "tool_name": "get_news", "arguments": {"topic": "tech"}},
    ]
    overlapped, out_of_order = 0, 0
    for attempt in range(5):
        started = time.monotonic()
        turn = producer.submit(
            [{**p, "call_id": f"{p['call_id']}-{attempt}"} for p in proposals], SUPPORT_A
        )
        collected = producer.collect(turn.turn_id, timeout=15)
        elapsed = time.monotonic() - started

        # Joined by id, in proposal order, whatever order they finished in: every time.
        assert collected.complete and collected.pending == []
        ids = [f"call-{x}-{attempt}" for x in "ABC"]
        assert [r.call_id for r in collected.results] == ids
        by_id = {r.call_id: r for r in collected.results}
        assert by_id[ids[0]].data["content"]["city"] == "Seoul"
        assert by_id[ids[1]].data["content"]["symbol"] == "NVDA"
        assert by_id[ids[2]].data["content"]["topic"] == "tech"

        intervals = _execution_intervals(engine, turn.turn_id)
        assert sorted(intervals) == sorted(ids)
        assert all(start is not None and end is not None for start, end in intervals.values())
        finished = sorted(intervals, key=lambda c: intervals[c][1])
        latest_start = max(start for start, _ in intervals.values())
        earliest_end = min(end for _, end in intervals.values())
        overlapped += latest_start < earliest_end
        out_of_order += finished != ids
        print(
            f"attempt {attempt}: {elapsed * 1000:.0f} ms end to end; finished {finished};"
            f" overlap {(earliest_end - latest_start).total_seconds() * 1000:.0f} ms"
        )
        if overlapped and out_of_order:
            break
    # All three ran at once in some turn, and fan-in joined out-of-order completions by id.
    assert overlapped >= 1
    assert out_of_order >= 1


def test_b_one_write_enqueued_three_times_raced_by_four_workers(
    producer, stack, engine, fresh_payments
):
    turn_id, ref, op = _refund(producer)  # enqueued once by submit
    transport.enqueue_calls(producer.queue, [uuid.UUID(ref)] * 2, timeout=60)  # and twice more
    assert producer.queue.count == 3
    stack(workers=4, CALLGATE_DEMO_DELAY_MS="refund_payment=300:0")

    collected = producer.collect(turn_id, timeout=15)
    assert collected.complete and [r.status for r in collected.results] == ["succeeded"]
    wait_until(
        lambda: len(trace_events(engine, ref, "duplicate_delivery")) == 2, what="2 duplicates"
    )
    effects = side_effects(engine, op)
    assert len(effects) == 1
    assert len(_refund_ids(engine)) == 1
    assert scalar(engine, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=ref) == 1
    assert len(trace_events(engine, ref, "reserved")) == 1
    assert (
        scalar(engine, "SELECT refunded FROM downstream.payments WHERE order_id = 'O-17'") == 12000
    )


def test_c_worker_killed_in_the_crash_gap_still_succeeds_once(
    producer, stack, engine, fresh_payments
):
    s = stack(workers=1, CALLGATE_DEMO_DELAY_MS="refund_payment=0:2000", **FAST_RECOVERY)
    turn_id, ref, op = _refund(producer)
    # The downstream applied the refund; the worker now sleeps before completing.
    wait_until(lambda: side_effects(engine, op), what="the refund to reach the downstream")
    s.signal("worker-1", signal.SIGKILL)
    s.procs["worker-1"].wait()
    assert scalar(engine, "SELECT state FROM callgate.calls WHERE id = :r", r=ref) == "started"
    s.start_worker("worker-2")

    collected = producer.collect(turn_id, timeout=20)
    assert collected.complete
    (result,) = collected.results
    assert result.status == "succeeded"
    assert len(side_effects(engine, op)) == 1
    (refund_id,) = _refund_ids(engine)
    assert result.data["content"]["refund_id"] == refund_id  # the first result, reused
    assert result.data["content"]["replayed"] is True
    takeover = trace_events(engine, ref, "takeover")
    assert [e["generation"] for e in takeover] == [2]


@pytest.mark.parametrize("stall", ["before_write", "after_write"])
def test_d_stale_worker_is_fenced_off(producer, stack, engine, fresh_payments, stall):
    delay = "refund_payment=1500:0" if stall == "before_write" else "refund_payment=0:1500"
    s = stack(workers=1, CALLGATE_DEMO_DELAY_MS=delay, **FAST_RECOVERY)
    turn_id, ref, op = _refund(producer)
    if stall == "before_write":
        wait_until(lambda: trace_events(engine, ref, "reserved"), what="gen 1 reservation")
    else:
        wait_until(lambda: side_effects(engine, op), what="gen 1's downstream write")
    s.signal("worker-1", signal.SIGSTOP)  # A holds generation 1 and stalls past its lease
    s.start_worker("worker-2")  # B takes over with generation 2 and finishes

    collected = producer.collect(turn_id, timeout=20)
    (result,) = collected.results
    assert result.status == "succeeded"
    before = scalar(engine, "SELECT result::text FROM callgate.calls WHERE id = :r", r=ref)
    assert [e["generation"] for e in trace_events(engine, ref, "takeover")] == [2]

    s.signal("worker-1", signal.SIGCONT)  # A wakes up with generation 1
    if stall == "before_write":
        wait_until(
            lambda: trace_events(engine, ref, "stale_fence_rejected"), what="fence rejection"
        )
        rejected = scalar(
            engine,
            "SELECT count(*) FROM downstream.rejections WHERE reason = 'stale_fence'"
            " AND fencing_token = 1",
        )
        assert rejected == 1
        assert [e["fencing_token"] for e in side_effects(engine, op)] == [2]
    else:
        wait_until(
            lambda: trace_events(engine, ref, "stale_completion_rejected"), what="CAS rejection"
        )
        assert [e["fencing_token"] for e in side_effects(engine, op)] == [1]
    assert len(side_effects(engine, op)) == 1
    assert scalar(engine, "SELECT result::text FROM callgate.calls WHERE id = :r", r=ref) == before
    assert scalar(engine, "SELECT count(*) FROM callgate.outbox WHERE call_ref = :r", r=ref) == 1
    assert len(trace_events(engine, ref, "completed")) == 1
    assert (
        scalar(engine, "SELECT refunded FROM downstream.payments WHERE order_id = 'O-17'") == 12000
    )


def test_e_relayer_killed_between_publish_and_mark(producer, stack, engine):
    s = stack(workers=2, relayer=False)
    # A relayer with a wide publish→mark window, so the kill lands between the two.
    slow = s.start("relayer-slow", ["relayer"], env={"CALLGATE_RELAYER_MARK_DELAY_MS": "5000"})
    turn = producer.submit(
        [
            {
                "call_id": "r1",
                "tool_name": "get_weather",
                "arguments": {"city": "Oslo", "unit": "celsius"},
            },
            {"call_id": "r2", "tool_name": "get_news", "arguments": {"topic": "rq"}},
        ],
        SUPPORT_A,
    )
    stream = transport.results_stream(producer.settings.queue, turn.turn_id)
    wait_until(lambda: producer.redis.xlen(stream) == 2, what="first publish")
    assert (
        scalar(
            engine,
            "SELECT count(*) FROM callgate.outbox WHERE turn_id = :t AND published_at IS NULL",
            t=turn.turn_id,
        )
        == 2
    )
    slow.send_signal(signal.SIGKILL)  # published, not yet marked
    slow.wait()
    s.start("relayer-2", ["relayer"])
    wait_until(
        lambda: (
            scalar(
                engine,
                "SELECT count(*) FROM callgate.outbox WHERE turn_id = :t AND published_at IS NULL",
                t=turn.turn_id,
            )
            == 0
        ),
        what="republish and mark",
    )
    entries = producer.redis.xrange(stream)
    assert len(entries) == 4  # each result published twice

    fan = FanIn([("r1", "get_weather"), ("r2", "get_news")])
    for _id, fields in entries:
        fan.add(json.loads(fields[b"result"]))
    assert fan.complete and fan.duplicates == 2

    collected = producer.collect(turn.turn_id, timeout=5)
    assert collected.complete
    assert [r.call_id for r in collected.results] == ["r1", "r2"]
