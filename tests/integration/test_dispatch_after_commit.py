"""``transport.dispatch_after_commit``: the one way a committed change's calls reach Redis.
With Redis up each call gets one job; with Redis gone (a proxy stopped: a real refused
connect) nothing is raised, one warning is logged and the error is returned, for the
sweeper to cover."""

from __future__ import annotations

import logging
import uuid

import pytest
import redis

from callgate.core.errors import ErrorCode
from callgate.queue import transport
from tests.faults.redisproxy import RedisProxy


def test_each_call_gets_one_job(redis_url: str, queue_name: str) -> None:
    queue = transport.job_queue(transport.connect(redis_url), queue_name)
    refs = [uuid.uuid4() for _ in range(3)]
    try:
        left = transport.dispatch_after_commit(queue, refs, timeout=30, who="test")
        assert left is None
        assert sorted(queue.job_ids) == sorted(transport.job_id(r) for r in refs)
        assert transport.dispatch_after_commit(queue, [], timeout=30, who="test") is None
        assert queue.count == 3
    finally:
        queue.empty()


def test_redis_gone_is_returned_and_logged_not_raised(
    redis_url: str,
    queue_name: str,
    redis_proxy: RedisProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    through = redis_proxy.url(redis_url)
    queue = transport.job_queue(redis.Redis.from_url(through, socket_connect_timeout=2), queue_name)
    redis_proxy.stop()
    refs = [uuid.uuid4() for _ in range(3)]
    with caplog.at_level(logging.WARNING, logger="callgate.transport"):
        left = transport.dispatch_after_commit(queue, refs, timeout=30, who="test")
    assert left is not None and left.code == ErrorCode.REDIS_UNAVAILABLE
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "test: 3 call(s) committed but not enqueued" in warnings[0]
    assert transport.job_queue(transport.connect(redis_url), queue_name).count == 0
