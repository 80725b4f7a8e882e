"""What a ``dramatiq`` worker of the bench's threaded baseline imports: its broker, its actors
and the middleware that records when messages ran. Only the ``dramatiq`` CLI imports it (it
reads its queue and Redis from the environment at import), never the bench itself.

Timing, per process and in memory: the first message's start (``before_process_message``),
the last acknowledgement (``after_ack``: a message is complete once dramatiq acked it) and a
count, under one lock. That costs two clock reads and two uncontended lock round trips per
message, a few microseconds against the hundreds a message costs dramatiq, and no I/O; each
process writes its three figures to Redis once, on shutdown (one RPUSH).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from callgate.ops.lab.bench import durable
from callgate.ops.lab.bench.threaded import namespace, timings_key

QUEUE = os.environ["CALLGATE_QUEUE"]
REDIS_URL = os.environ["CALLGATE_REDIS_URL"]


class Timing(Middleware):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first = math.inf
        self.last = 0.0
        self.count = 0

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        now = time.time()
        with self.lock:
            self.first = min(self.first, now)

    def after_ack(self, broker: dramatiq.Broker, message: Any) -> None:
        now = time.time()
        with self.lock:
            self.last = max(self.last, now)
            self.count += 1

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        first = self.first if math.isfinite(self.first) else None  # None: it ran nothing
        figures = {"pid": os.getpid(), "first": first, "last": self.last, "n": self.count}
        client = redis.Redis.from_url(REDIS_URL)
        try:
            client.rpush(timings_key(QUEUE), json.dumps(figures))
        finally:
            client.close()


class ConnectEachThread(Middleware):
    """For the minimum durable work: each worker thread connects to Postgres when it starts,
    before its first message (start-up stays outside the window); with ``downstream``, to
    the payments provider too."""

    def __init__(self, *, downstream: bool = False) -> None:
        self.downstream = downstream

    def after_worker_thread_boot(self, broker: dramatiq.Broker, thread: Any) -> None:
        durable.warm()
        if self.downstream:
            durable.warm_downstream()


broker = RedisBroker(url=REDIS_URL, namespace=namespace(QUEUE))  # type: ignore[no-untyped-call]
broker.add_middleware(Timing())
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    """Does nothing: what is left is the queue's own per-message cost."""


@dramatiq.actor(queue_name=QUEUE)
def sleep_ms(ms: int) -> None:
    """Waits on I/O for ``ms`` milliseconds."""
    time.sleep(ms / 1000)


@dramatiq.actor(queue_name=QUEUE)
def minimum_durable(call_id: str) -> None:
    """The minimum durable work of one call (``callgate.ops.lab.bench.durable``)."""
    durable.work(call_id)


# No retries: a refund the provider refused is a broken run, which the bench reports at once
# (a message not acknowledged) instead of waiting out dramatiq's backoff; and retrying is
# not part of the floor.
@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def minimum_durable_refund(call_id: str, tenant_id: str, payment_id: str, amount: int) -> None:
    """The minimum durable work around the write scenario's refund
    (``callgate.ops.lab.bench.durable.refund``)."""
    durable.refund(call_id, tenant_id, payment_id, amount)
