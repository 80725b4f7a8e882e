"""The relayer's counts against real Postgres and Redis: a relayer whose Postgres session is
terminated between publish and mark leaves its row unmarked, and the next drain publishes it
again and counts that as a re-publish, with no extra round trip."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from callgate.core.types import CallContext, ProposedCall
from callgate.daemons import relayer
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer.planning import plan
from callgate.queue import transport
from callgate.store import db, reservations, turns

CTX = CallContext(request_id="r", tenant_id="tenant-a", user_id="user-17", roles=("support",))
APP = "callgate-relayer-metrics-test"


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


@pytest.fixture
def own_engine(make_own_database: Callable[[], str]) -> Iterator[Engine]:
    """Its own database: a drain claims every unpublished row there is."""
    engine = db.create(make_own_database(), application_name=APP)
    yield engine
    engine.dispose()


def test_a_row_published_again_after_its_mark_was_lost_counts_as_a_republish(
    own_engine: Engine, redis_url: str, queue_name: str
) -> None:
    (planned,) = plan(
        [ProposedCall(call_id="c1", tool_name="get_weather", arguments={"city": "Oslo"})],
        CTX,
        demo_registry(),
    )
    turn_id, _ = turns.record(own_engine, CTX, [planned])
    error = {"code": "invalid_arguments", "details": []}
    reservations.reject(own_engine, call_ref=planned.ref, status="failed_terminal", error=error)
    connection = redis.Redis.from_url(redis_url)
    stream = transport.results_stream(queue_name, turn_id)
    published = sample("callgate_outbox_published_total")
    republished = sample("callgate_outbox_republished_total")
    relayed = sample("callgate_relay_seconds_count")

    # The first relayer publishes, then waits before its mark; its session is terminated.
    failed: list[BaseException] = []

    def first() -> None:
        try:
            relayer.drain_once(own_engine, connection, queue=queue_name, batch=10, mark_delay=3)
        except Exception as exc:
            failed.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    deadline = time.monotonic() + 15
    while connection.xlen(stream) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert connection.xlen(stream) == 1
    with db.create(own_engine.url.render_as_string(hide_password=False)).connect() as admin:
        admin.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = :a AND state = 'idle in transaction'"
            ),
            {"a": APP},
        )
    thread.join(15)
    assert failed, "the first relayer's mark should have failed"

    # The row is still unpublished: the next drain publishes it again and says so.
    assert relayer.drain_once(own_engine, connection, queue=queue_name, batch=10) == 1
    assert connection.xlen(stream) == 2
    assert sample("callgate_outbox_published_total") == published + 2
    assert sample("callgate_outbox_republished_total") == republished + 1
    assert sample("callgate_relay_seconds_count") == relayed + 2
    # A third drain finds nothing.
    assert relayer.drain_once(own_engine, connection, queue=queue_name, batch=10) == 0
    connection.delete(stream, transport.published_marks(stream))
    connection.close()
