"""The gauges read from Postgres and Redis (callgate/daemons/gauges.py) against real rows, and their
queries' plans: each reads a partial index of open rows, never the history."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from callgate.daemons import gauges
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db, gauge_reads

pytestmark = pytest.mark.services

SUPPORT = {"request_id": "r", "tenant_id": "tenant-a", "user_id": "user-17", "roles": ["support"]}
WEATHER = {"city": "Seoul", "unit": "celsius"}
RECONCILE = {"status": "failed_terminal", "error": {"code": "reconciliation_pending"}}


@pytest.fixture
def database_url(make_own_database: Callable[[], str]) -> str:
    """Its own database: the gauges count every open row in it."""
    return make_own_database()


def scrape(
    engine: Engine, redis_url: str, queue: str, *, window: float = 900.0
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    connection = transport.connect(redis_url)
    collector = gauges.StateCollector(
        engine,
        connection,
        queue_key=transport.job_queue(connection, queue).key,
        window_seconds=window,
    )
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def run(engine: Engine, sql: str, **params: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(sql), params)


def test_an_empty_database_reports_zeros(engine: Engine, redis_url: str, queue_name: str) -> None:
    got = scrape(engine, redis_url, queue_name)
    for state in gauges.OPEN_STATES:
        for age, _ in gauges.AGE_BUCKETS:
            assert value(got, "callgate_calls_open", state=state, age=age) == 0
        assert value(got, "callgate_calls_open_oldest_age_seconds", state=state) == 0
    for name in (
        "callgate_calls_past_recovery_window",
        "callgate_outbox_unpublished",
        "callgate_outbox_oldest_unpublished_age_seconds",
        "callgate_operations_awaiting_reconciliation",
        "callgate_operations_awaiting_reconciliation_oldest_age_seconds",
        "callgate_approvals_pending",
        "callgate_approvals_oldest_pending_age_seconds",
        "callgate_queue_depth",
    ):
        assert value(got, name) == 0, name
    assert value(got, "callgate_state_source_up", source="postgres") == 1
    assert value(got, "callgate_state_source_up", source="redis") == 1
    assert value(got, "callgate_recovery_window_seconds") == 900


def test_open_work_is_counted_by_state_and_age(
    engine: Engine, producer: Producer, redis_url: str, queue_name: str
) -> None:
    reads = producer.submit(
        [{"call_id": f"r{i}", "tool_name": "get_weather", "arguments": WEATHER} for i in range(3)],
        SUPPORT,
    )
    # Two writes of one turn: the second waits behind the first, which waits for a person.
    writes = producer.submit(
        [
            {
                "call_id": "w1",
                "tool_name": "send_email",
                "arguments": {"to": "a@example.com", "template": "welcome"},
            },
            {
                "call_id": "w2",
                "tool_name": "send_email",
                "arguments": {"to": "b@example.com", "template": "welcome"},
            },
        ],
        SUPPORT,
    )
    r0, r1, r2 = (c.ref for c in reads.calls)
    w1, w2 = writes.calls
    # r0 runs now; r1 was proposed two hours ago and never ran (past the window); r2 is new.
    run(engine, "UPDATE callgate.calls SET state = 'started' WHERE id = :r", r=r0)
    run(
        engine,
        "UPDATE callgate.calls SET created_at = now() - interval '2 hours' WHERE id = :r",
        r=r1,
    )
    # w1 parked on a pending request asked ten minutes ago; w2, behind it, is old too but
    # waits for that person, not for the sweeper.
    approval = uuid.uuid4()
    run(
        engine,
        "INSERT INTO callgate.approvals (approval_id, operation_id, version, tool_name,"
        " tenant_id, requested_by, intent_hash, policy_version, impact, created_at)"
        " VALUES (:a, :op, 1, 'send_email', 'tenant-a', 'user-17', 'i', 'p', '{}',"
        " now() - interval '10 minutes')",
        a=approval,
        op=w1.operation_id,
    )
    run(
        engine,
        "UPDATE callgate.calls SET state = 'awaiting_approval', approval_id = :a,"
        " created_at = now() - interval '20 minutes' WHERE id = :r",
        a=approval,
        r=w1.ref,
    )
    run(
        engine,
        "UPDATE callgate.calls SET created_at = now() - interval '3 hours' WHERE id = :r",
        r=w2.ref,
    )
    # An unpublished result 30 s old, and a write awaiting reconciliation for two hours.
    run(
        engine,
        "INSERT INTO callgate.outbox (turn_id, call_ref, payload, created_at)"
        " VALUES (:t, :r, '{}', now() - interval '30 seconds')",
        t=reads.turn_id,
        r=r2,
    )
    run(
        engine,
        "INSERT INTO callgate.operations (operation_id, tenant_id, tool_name, idempotency_key,"
        " state, result, completed_at)"
        " VALUES ('op-rec', 'tenant-a', 'send_email', 'k-rec', 'failed', CAST(:b AS jsonb),"
        " now() - interval '2 hours')",
        b=json.dumps(RECONCILE),
    )
    got = scrape(engine, redis_url, queue_name, window=900)

    assert value(got, "callgate_calls_open", state="started", age="under_1m") == 1
    assert value(got, "callgate_calls_open", state="proposed", age="under_1m") == 1  # r2
    assert value(got, "callgate_calls_open", state="proposed", age="over_1h") == 2  # r1, w2
    assert value(got, "callgate_calls_open", state="awaiting_approval", age="15m_to_1h") == 1
    assert sum(v for (n, _), v in got.items() if n == "callgate_calls_open") == 5
    oldest = value(got, "callgate_calls_open_oldest_age_seconds", state="proposed")
    assert oldest is not None and 3 * 3600 - 5 < oldest < 3 * 3600 + 60
    # r1 only: w2 waits behind a parked write, awaiting_approval waits for a person.
    assert value(got, "callgate_calls_past_recovery_window") == 1
    assert value(got, "callgate_outbox_unpublished") == 1
    age = value(got, "callgate_outbox_oldest_unpublished_age_seconds")
    assert age is not None and 29 < age < 90
    assert value(got, "callgate_operations_awaiting_reconciliation") == 1
    age = value(got, "callgate_operations_awaiting_reconciliation_oldest_age_seconds")
    assert age is not None and 7190 < age < 7300
    assert value(got, "callgate_approvals_pending") == 1
    age = value(got, "callgate_approvals_oldest_pending_age_seconds")
    assert age is not None and 599 < age < 700
    # The producer enqueued the three reads and the first write (the second follows it).
    assert value(got, "callgate_queue_depth") == 4


def test_an_unreachable_source_is_reported_not_guessed(
    engine: Engine, make_database: Callable[..., str], queue_name: str
) -> None:
    empty = db.create(make_database())  # no callgate schema: every query fails
    try:
        got = scrape(empty, "redis://127.0.0.1:1/0", queue_name)
    finally:
        empty.dispose()
    assert value(got, "callgate_state_source_up", source="postgres") == 0
    assert value(got, "callgate_state_source_up", source="redis") == 0
    assert value(got, "callgate_calls_past_recovery_window") is None
    assert value(got, "callgate_queue_depth") is None
    assert value(got, "callgate_recovery_window_seconds") == 900


@pytest.fixture
def history(engine: Engine) -> Iterator[None]:
    """20,000 finished calls, operations, published outbox rows and decided approvals."""
    turn = uuid.uuid4()
    run(
        engine,
        "INSERT INTO callgate.turns (turn_id, request_id, tenant_id, user_id, roles)"
        " VALUES (:t, 'r', 'tenant-a', 'user-17', ARRAY['support'])",
        t=turn,
    )
    run(
        engine,
        "INSERT INTO callgate.operations (operation_id, tenant_id, tool_name, idempotency_key,"
        " state, result, completed_at)"
        " SELECT 'h-' || g, 'tenant-a', 'send_email', 'hk-' || g,"
        "        CASE WHEN g % 2 = 0 THEN 'succeeded' ELSE 'failed' END,"
        '        \'{"status": "failed_terminal", "error": {"code": "permission_denied"}}\','
        "        now() FROM generate_series(1, 20000) AS g",
    )
    run(
        engine,
        "INSERT INTO callgate.calls (id, turn_id, call_id, position, tool_name, arguments,"
        " kind, operation_id, args_hash, state, result, completed_at)"
        " SELECT gen_random_uuid(), :t, 'h' || g, g, 'send_email', '{}', 'write', 'h-' || g,"
        "        'x', 'succeeded', '{}', now() FROM generate_series(1, 20000) AS g",
        t=turn,
    )
    run(
        engine,
        "INSERT INTO callgate.outbox (turn_id, call_ref, payload, published_at)"
        " SELECT turn_id, id, '{}', now() FROM callgate.calls WHERE turn_id = :t",
        t=turn,
    )
    run(
        engine,
        "INSERT INTO callgate.approvals (approval_id, operation_id, version, tool_name,"
        " tenant_id, requested_by, intent_hash, policy_version, impact, state, decided_by)"
        " SELECT gen_random_uuid(), 'h-' || g, 1, 'send_email', 'tenant-a', 'user-17', 'i',"
        "        'p', '{}', 'approved', 'user-5' FROM generate_series(1, 20000) AS g",
    )
    with db.autocommit(engine) as conn:
        conn.execute(text("ANALYZE"))
    yield


@pytest.mark.parametrize(
    "sql", gauge_reads.QUERIES, ids=["calls", "outbox", "reconciliation", "approvals"]
)
def test_each_query_reads_an_index_never_the_history(
    engine: Engine, history: None, sql: str
) -> None:
    with engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql), {"window": 900.0}))
    scanned = set(re.findall(r"Seq Scan on (\w+)", plan))
    assert not scanned, f"sequential scan of {scanned}:\n{plan}"
    assert "Index" in plan, plan


def test_a_resolved_reconciliation_leaves_the_gauge(
    engine: Engine, redis_url: str, queue_name: str
) -> None:
    from callgate.store import reconciliation

    for op in ("op-a", "op-b"):
        run(
            engine,
            "INSERT INTO callgate.operations (operation_id, tenant_id, tool_name,"
            " idempotency_key, state, result, completed_at)"
            " VALUES (:op, 'tenant-a', 'send_email', :k, 'failed', CAST(:b AS jsonb),"
            " now() - interval '2 hours')",
            op=op,
            k=f"k-{op}",
            b=json.dumps(RECONCILE),
        )
    assert (
        value(scrape(engine, redis_url, queue_name), "callgate_operations_awaiting_reconciliation")
        == 2
    )
    reconciliation.resolve(engine, "op-a", outcome="succeeded", by="user-5")
    got = scrape(engine, redis_url, queue_name)
    assert value(got, "callgate_operations_awaiting_reconciliation") == 1
    reconciliation.resolve(engine, "op-b", outcome="failed", by="user-5")
    got = scrape(engine, redis_url, queue_name)
    assert value(got, "callgate_operations_awaiting_reconciliation") == 0
    assert value(got, "callgate_operations_awaiting_reconciliation_oldest_age_seconds") == 0
