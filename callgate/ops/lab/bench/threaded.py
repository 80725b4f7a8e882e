"""The threaded queue's side: dramatiq 2 with its Redis broker, W processes of K threads.

The messages are enqueued before the workers start; the ``dramatiq`` CLI then runs until
the queue is drained (it has no burst mode: the bench polls the broker's own hash of
unacknowledged messages, then stops it with SIGTERM). No-op and sleeping messages are timed
by the workers' middleware (``dramatiq_worker.Timing``: first start → last acknowledgement,
over every process); the minimum durable work, alone or around the write scenario's
refund, by its rows' Postgres timestamps, as callgate's own runs are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dramatiq import Message
from dramatiq.brokers.redis import RedisBroker

from callgate.ops.lab.bench import durable, procs
from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.services import Services, delete_keys, queue_name

DRAIN_TIMEOUT_SECONDS = 600.0
WORKER_MODULE = "callgate.ops.lab.bench.dramatiq_worker"
DURABLE_MODULE = "callgate.ops.lab.bench.dramatiq_durable"
DURABLE_REFUND_MODULE = "callgate.ops.lab.bench.dramatiq_durable_refund"


def namespace(queue: str) -> str:
    """The broker's key prefix of one run: its keys never meet another run's."""
    return f"dramatiq-{queue}"


def timings_key(queue: str) -> str:
    return f"{namespace(queue)}:bench-timings"


@dataclass(frozen=True)
class Timings:
    """Over every worker process: messages acknowledged, first start, last acknowledgement."""

    processes: int
    messages: int
    first: float
    last: float

    def per_second(self) -> float:
        return self.messages / max(self.last - self.first, 1e-6)


def noops(services: Services, calls: int, *, processes: int, threads: int) -> Timings:
    messages = [("noop", ())] * calls
    return _run(services, messages, processes, threads, [WORKER_MODULE])


def sleeps(services: Services, calls: int, ms: int, *, processes: int, threads: int) -> Timings:
    messages = [("sleep_ms", (ms,))] * calls
    return _run(services, messages, processes, threads, [WORKER_MODULE])


def durable_burst(services: Services, calls: int, *, processes: int, threads: int) -> durable.Run:
    """The minimum durable work of ``calls`` calls whose rows exist before the workers
    start; read (and checked: one winner, one result and one outbox row each) from them."""
    run, call_ids = durable.seed(services.engine, calls)
    try:
        messages = [("minimum_durable", (c,)) for c in call_ids]
        _run(services, messages, processes, threads, [WORKER_MODULE, DURABLE_MODULE])
        return durable.checked(services.engine, run, "dramatiq + minimum durable work")
    finally:
        durable.delete(services.engine, run)


def durable_refunds(services: Services, calls: int, *, processes: int, threads: int) -> durable.Run:
    """The writes' threaded ceiling: ``calls`` messages of the minimum durable work around
    the same refunds as the write scenario's (``durable.refund``); read from the rows and
    checked on both sides: one winner, one result and one outbox row per call, and one
    refund per call at the provider."""
    run, plan = durable.seed_refunds(services.engine, calls)
    try:
        messages = [("minimum_durable_refund", args) for args in plan]
        _run(services, messages, processes, threads, [WORKER_MODULE, DURABLE_REFUND_MODULE])
        what = "dramatiq + minimum durable work + the same refund"
        return durable.checked(services.engine, run, what, refunds=True)
    finally:
        durable.delete(services.engine, run)


def _run(
    services: Services,
    messages: Sequence[tuple[str, tuple[Any, ...]]],
    processes: int,
    threads: int,
    modules: list[str],
) -> Timings:
    queue = queue_name("benchdq")
    broker = RedisBroker(url=services.redis_url, namespace=namespace(queue))  # type: ignore[no-untyped-call]
    children: list[procs.Child] = []
    try:
        for actor, args in messages:
            broker.enqueue(
                Message(queue_name=queue, actor_name=actor, args=args, kwargs={}, options={})
            )
        child = procs.dramatiq(modules, queue, processes, threads, services.env(queue))
        children.append(child)
        _await_drained(services, queue, child)
        procs.stop(children)
        if child.proc.returncode != 0:
            raise BenchError(f"dramatiq exited {child.proc.returncode}: {child.tail()}")
        procs.forget([child])
        found = _timings(services, queue)
        if found.processes != processes or found.messages != len(messages):
            raise BenchError(
                f"dramatiq: {found.processes} of {processes} processes reported, "
                f"{found.messages} of {len(messages)} messages acknowledged"
            )
        return found
    finally:
        procs.stop(children)  # no-op once it exited; never leaves it running on an error
        broker.client.close()
        delete_keys(services.redis, f"{namespace(queue)}:*")


def _await_drained(services: Services, queue: str, child: procs.Child) -> None:
    """Until the broker holds no unacknowledged message of the queue (dramatiq keeps each
    message in ``<namespace>:<queue>.msgs`` from enqueue to ack)."""
    pending = f"{namespace(queue)}:{queue}.msgs"
    deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
    while services.redis.hlen(pending):
        if child.proc.poll() is not None:
            raise BenchError(f"dramatiq exited {child.proc.returncode}: {child.tail()}")
        if time.monotonic() > deadline:
            procs.stop([child])
            raise BenchError(f"dramatiq: queue not drained after {DRAIN_TIMEOUT_SECONDS:g}s")
        time.sleep(0.02)


def _timings(services: Services, queue: str) -> Timings:
    raw = services.redis.lrange(timings_key(queue), 0, -1)
    reports = [json.loads(r) for r in raw]
    ran = [r for r in reports if r["first"] is not None]
    if not ran:
        raise BenchError("dramatiq: no worker process reported a message")
    return Timings(
        processes=len(reports),
        messages=sum(r["n"] for r in reports),
        first=min(r["first"] for r in ran),
        last=max(r["last"] for r in ran),
    )
