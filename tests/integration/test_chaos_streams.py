"""The chaos runner's stream check on a real Redis: copies of one result pass, a second,
different ending for the same call is a violation."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping

import pytest
import redis

from callgate.ops.lab.chaos.runner import one_result_per_call
from callgate.queue import transport
from tests.conftest import REDIS_URL


@pytest.fixture
def connection() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def _publish(connection: redis.Redis, queue: str, turn: str, result: Mapping[str, object]) -> None:
    stream = transport.results_stream(queue, turn)
    connection.xadd(stream, {"outbox_id": str(uuid.uuid4()), "result": json.dumps(result)})
    connection.expire(stream, 60)


def test_republished_copies_pass_and_a_different_ending_does_not(
    connection: redis.Redis,
) -> None:
    queue, turn = f"streams-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    ok = {"call_id": "c1", "status": "succeeded", "output": {"n": 1}}
    _publish(connection, queue, turn, ok)
    _publish(connection, queue, turn, dict(reversed(ok.items())))  # same result, other order
    _publish(connection, queue, turn, {"call_id": "c2", "status": "succeeded", "output": {}})
    assert one_result_per_call(connection, queue, [turn, turn]) == []

    failed = {"call_id": "c1", "status": "failed_terminal", "error": {"code": "x"}}
    _publish(connection, queue, turn, failed)
    assert one_result_per_call(connection, queue, [turn]) == [
        "call c1 has 2 different results on its turn's stream (one)"
    ]
