"""A new PostgreSQL history's epoch is never one already handed out.

A second failover may promote a replica that never received the first failover's
reconciliation: its own rows say the last epoch is 0, while fencing tokens of epoch 1 were
handed out on the lost server and its relayer published under epoch 1. The new history must
be numbered past both: past its rows and past the results fence Redis keeps.

The history change is made by rewriting the recorded identity of the server's history, which
is what the reconciler compares: to callgate, the server is then one it has not seen."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from rq import Queue
from sqlalchemy import Engine, text

from callgate.daemons import failover
from callgate.queue import results
from callgate.store import db, histories


@pytest.fixture
def own(make_own_database: Callable[[], str]) -> Iterator[Engine]:
    engine = db.create(make_own_database())
    yield engine
    engine.dispose()


@pytest.fixture
def queue(redis_url: str) -> Iterator[Queue]:
    connection = redis.Redis.from_url(redis_url)
    q = Queue(f"epochs-{uuid.uuid4().hex[:8]}", connection=connection)
    yield q
    connection.delete(results.fence_key(q.name))
    connection.close()


def _server_forgotten(engine: Engine) -> None:
    """The recorded history is now some other server's: this one's is new."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE callgate.histories SET system_identifier = system_identifier + 1")
        )


def _epochs(engine: Engine) -> list[tuple[int, bool]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT epoch, reconciled_at IS NOT NULL FROM callgate.histories ORDER BY 1")
        ).all()
    return [(int(r[0]), bool(r[1])) for r in rows]


def test_a_first_failover_is_epoch_one(own: Engine, queue: Queue) -> None:
    _server_forgotten(own)
    done = failover.reconcile(own, queue, job_timeout=60)
    assert done is not None and done.epoch == 1
    assert _epochs(own) == [(0, True), (1, True)]
    assert histories.epoch(own) == 1
    assert results.fence(queue.connection, queue.name) == 1


def test_a_replica_that_missed_the_last_reconciliation_numbers_past_the_fence(
    own: Engine, queue: Queue
) -> None:
    # Epoch 1 was reconciled on a server this one never heard from; Redis remembers it.
    results.raise_fence(queue.connection, queue.name, 1)
    _server_forgotten(own)
    done = failover.reconcile(own, queue, job_timeout=60)
    assert done is not None and done.epoch == 2
    assert _epochs(own) == [(0, True), (2, True)]
    assert histories.epoch(own) == 2
    assert histories.fencing_token(2, 1) > histories.fencing_token(1, 2**31)
    # Rows a relayer read from the lost epoch-1 server are refused from now on.
    with pytest.raises(results.FencedOff):
        results.publish(
            queue.connection, queue.name, 1, [results.Row(1, uuid.uuid4(), '{"call_id":"c"}')]
        )
