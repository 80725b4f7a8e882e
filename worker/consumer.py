"""A worker process's consumer: takes call refs off callgate's RQ queue, K at a time.

Why not RQ's own worker loop: it runs one job at a time per process, and most of a no-op
call's time goes to per-job bookkeeping (started and finished registries, job heartbeats,
results) that callgate does not need: Postgres holds every call's state, lease and result,
and the sweeper dispatches again whatever is lost. The queue stays RQ's (producers enqueue
with ``Queue.enqueue_many``; ``rq info`` shows the queue and these workers); this consumer
reads it with two Redis round trips per batch of jobs and deletes each job as it takes it.

Each call runs on a thread of its own, up to ``concurrency`` at once, with its own lease,
heartbeat, fence and completion. ``stop()`` (SIGTERM) stops taking calls and waits for the
ones in flight up to a grace period; a SIGKILL loses nothing that Postgres does not still
know about.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from callgate.store import metrics
from callgate.worker import executor
from callgate.worker.runtime import Runtime

log = logging.getLogger("callgate.worker")

POLL_SECONDS = 1.0
REGISTRATION_HEARTBEAT_SECONDS = 60.0


class Consumer:
    def __init__(
        self,
        rt: Runtime,
        *,
        concurrency: int,
        name: str | None = None,
        burst: bool = False,
        grace_seconds: float = 30.0,
    ) -> None:
        self.rt = rt
        self.concurrency = concurrency
        self.burst = burst
        self.grace_seconds = grace_seconds
        self.queue_key = rt.queue.key
        self.in_flight = 0
        self.done = 0
        self._slots = threading.Condition()
        self._stopping = threading.Event()
        # Registered with RQ only so that `rq info` and Worker.all() see this process.
        self._registration = SimpleWorker(
            [rt.queue], connection=rt.redis, name=name, serializer=JSONSerializer
        )

    def stop(self) -> None:
        """Take no more calls; the ones in flight finish (within the grace period)."""
        self._stopping.set()
        with self._slots:
            self._slots.notify_all()

    def run(self) -> None:
        self._registration.register_birth()  # type: ignore[no-untyped-call]
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="call")
        next_heartbeat = time.monotonic() + REGISTRATION_HEARTBEAT_SECONDS
        try:
            while not self._stopping.is_set():
                free = self._wait_for_free_slot()
                if free == 0:
                    continue
                try:
                    refs = self._take(free)
                except (RedisConnectionError, RedisTimeoutError) as exc:
                    # Redis is down or restarting: keep the calls in flight, try again. What
                    # Redis held meanwhile is re-dispatched from Postgres by the sweeper.
                    log.warning("cannot reach Redis (%s); retrying", exc)
                    self._stopping.wait(POLL_SECONDS)
                    continue
                if not refs:
                    if self.burst and self.in_flight == 0:
                        break
                    continue
                metrics.calls_taken(len(refs))
                for ref in refs:
                    with self._slots:
                        self.in_flight += 1
                    metrics.WORKER_IN_FLIGHT.inc()
                    pool.submit(self._run_one, ref)
                if time.monotonic() >= next_heartbeat:
                    with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                        self._registration.heartbeat()
                    next_heartbeat = time.monotonic() + REGISTRATION_HEARTBEAT_SECONDS
        finally:
            self._drain()
            pool.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                self._registration.register_death()  # type: ignore[no-untyped-call]

    def _wait_for_free_slot(self) -> int:
        with self._slots:
            while self.in_flight >= self.concurrency and not self._stopping.is_set():
                self._slots.wait(POLL_SECONDS)
            return 0 if self._stopping.is_set() else self.concurrency - self.in_flight

    def _take(self, count: int) -> list[uuid.UUID]:
        """Up to ``count`` call refs: whatever is queued now, else wait briefly for one."""
        redis = self.rt.redis
        ids: list[bytes] = redis.lpop(self.queue_key, count) or []  # type: ignore[assignment]
        if not ids and not (self.burst and self.in_flight == 0):
            popped: Any = redis.blpop([self.queue_key], timeout=POLL_SECONDS)
            ids = [popped[1]] if popped else []
        if not ids:
            return []
        with redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                key = Job.key_for(job_id.decode())
                pipe.hget(key, "data")
                pipe.delete(key)
            replies = pipe.execute()
        refs = []
        for data in replies[::2]:
            ref = _call_ref(data)
            if ref is not None:
                refs.append(ref)
        return refs

    def _run_one(self, ref: uuid.UUID) -> None:
        try:
            executor.execute(self.rt, ref)
        except Exception:  # the call stays open in Postgres; the sweeper dispatches it again
            log.exception("delivery of call %s failed", ref)
        finally:
            metrics.WORKER_IN_FLIGHT.dec()
            with self._slots:
                self.in_flight -= 1
                self.done += 1
                self._slots.notify_all()

    def _drain(self) -> None:
        deadline = time.monotonic() + self.grace_seconds
        with self._slots:
            while self.in_flight and time.monotonic() < deadline:
                self._slots.wait(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            if self.in_flight:
                log.warning(
                    "%d call(s) still running after %.0f s; their leases will expire and "
                    "another worker takes them over",
                    self.in_flight,
                    self.grace_seconds,
                )


def _call_ref(data: bytes | None) -> uuid.UUID | None:
    """The call ref an RQ job carries: ``(function, instance, [ref], {})``, JSON, zlib."""
    if data is None:  # the job's hash is gone (Redis flushed, or another copy took it)
        return None
    try:
        _func, _instance, args, _kwargs = json.loads(zlib.decompress(data))
        return uuid.UUID(args[0])
    except (zlib.error, ValueError, TypeError, IndexError) as exc:
        log.warning("dropped a job that carries no call ref: %s", exc)
        return None
