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
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from callgate.store import db, metrics, transport
from callgate.store.errors import ServiceUnavailable
from callgate.worker import executor, heartbeat
from callgate.worker.runtime import Runtime

log = logging.getLogger("callgate.worker")

POLL_SECONDS = 1.0
REGISTRATION_HEARTBEAT_SECONDS = 60.0
# A delivery that failed because PostgreSQL or Redis was unreachable is made again by the same
# worker, up to this many deliveries in all, this long apart.
OUTAGE_DELIVERIES = 3
OUTAGE_PAUSE_SECONDS = 1.0


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
        self._stop_requested_at: float | None = None
        # Calls still running when the grace period ended: their leases are no longer renewed,
        # and the process must exit without waiting for them (see ``process.run``).
        self.abandoned = 0
        # Registered with RQ only so that `rq info` and Worker.all() see this process.
        self._registration = SimpleWorker(
            [rt.queue], connection=rt.redis, name=name, serializer=JSONSerializer
        )
        self.name: str = self._registration.name
        queue = rt.settings.queue
        self._keys = [
            self.queue_key,
            transport.taking_key(queue, self.name),
            transport.taken_key(queue, self.name),
        ]
        self._job_prefix = Job.redis_job_namespace_prefix
        self._take_script = rt.redis.register_script(transport.TAKE_LUA)
        # Job ids whose deliveries returned: dropped from the taken hash on the next take.
        self._returned: list[str] = []
        self._liveness = Liveness(rt, self.name)

    def stop(self) -> None:
        """Take no more calls; the ones in flight finish (within the grace period, counted
        from the first request to stop)."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()
        with self._slots:
            self._slots.notify_all()

    def run(self) -> None:
        self._registration.register_birth()  # type: ignore[no-untyped-call]
        self._liveness.start()
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
                for job_id, ref in refs:
                    with self._slots:
                        self.in_flight += 1
                    metrics.WORKER_IN_FLIGHT.inc()
                    pool.submit(self._run_one, job_id, ref)
                if time.monotonic() >= next_heartbeat:
                    with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                        self._registration.heartbeat()
                    next_heartbeat = time.monotonic() + REGISTRATION_HEARTBEAT_SECONDS
        finally:
            self.abandoned = self._drain()
            if self.abandoned:
                # Before anything else: past the grace no lease of this process moves again,
                # so the calls it leaves are taken over when their leases run out.
                heartbeat.stop_renewing(self.rt.engine)
            pool.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                self._liveness.stop(self._pop_returned(), in_flight=self.in_flight)
                self._registration.register_death()  # type: ignore[no-untyped-call]

    def _wait_for_free_slot(self) -> int:
        with self._slots:
            while self.in_flight >= self.concurrency and not self._stopping.is_set():
                self._slots.wait(POLL_SECONDS)
            return 0 if self._stopping.is_set() else self.concurrency - self.in_flight

    def _take(self, count: int) -> list[tuple[str, uuid.UUID]]:
        """Up to ``count`` (job id, call ref): whatever is queued now, else wait briefly for
        one. Each job taken is recorded in this worker's taken hash in the same atomic step,
        so a sweeper can dispatch it again if this process dies before it finishes."""
        redis = self.rt.redis
        replies = self._take_script(
            keys=self._keys, args=[count, self._job_prefix, *self._pop_returned()]
        )
        if not replies and not (self.burst and self.in_flight == 0):
            # Wait for a job: BLMOVE keeps it on Redis (the taking list) until the script
            # takes it, so no moment exists where only this process knows of it.
            moved = redis.blmove(self._keys[0], self._keys[1], int(POLL_SECONDS), "LEFT", "RIGHT")
            if moved:
                replies = self._take_script(keys=self._keys, args=[count, self._job_prefix])
        refs = []
        for job_id, data in zip(replies[::2], replies[1::2], strict=True):
            ref = transport.call_ref(data)
            if ref is not None:
                refs.append((job_id.decode(), ref))
            else:
                self._returned.append(job_id.decode())
        return refs

    def _pop_returned(self) -> list[str]:
        with self._slots:
            returned, self._returned = self._returned, []
        return returned

    def _run_one(self, job_id: str, ref: uuid.UUID) -> None:
        try:
            for attempt in range(1, OUTAGE_DELIVERIES + 1):
                try:
                    executor.execute(self.rt, ref)
                    break
                except Exception as exc:
                    if attempt < OUTAGE_DELIVERIES and _outage(exc):
                        # PostgreSQL went away for longer than one statement's retries (a
                        # restart): deliver the call again here rather than leave it to the
                        # stale sweep. A delivery is always safe to repeat (the reservation
                        # CAS, the guarded completion).
                        log.warning("delivery of call %s met an outage (%s); again", ref, exc)
                        self._stopping.wait(OUTAGE_PAUSE_SECONDS)
                        continue
                    # The call stays open in Postgres; the sweeper dispatches it again.
                    log.exception("delivery of call %s failed", ref)
                    break
        finally:
            metrics.WORKER_IN_FLIGHT.dec()
            with self._slots:
                self._returned.append(job_id)
                self.in_flight -= 1
                self.done += 1
                self._slots.notify_all()

    def _drain(self) -> int:
        """Wait for the calls in flight until the grace period ends; the count still running."""
        start = self._stop_requested_at or time.monotonic()
        deadline = start + self.grace_seconds
        with self._slots:
            while self.in_flight and time.monotonic() < deadline:
                self._slots.wait(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            if self.in_flight:
                log.warning(
                    "%d call(s) still running after the %g s grace period; their leases are "
                    "no longer renewed, this worker exits, and another worker takes them over "
                    "once the leases expire",
                    self.in_flight,
                    self.grace_seconds,
                )
            return self.in_flight


def _outage(exc: BaseException) -> bool:
    return isinstance(exc, ServiceUnavailable) or db.is_transient(exc)


class Liveness:
    """Keeps this worker's liveness key alive on a thread of its own, so sweepers can tell
    a dead worker from a busy one within ``LIVENESS_TTL_SECONDS`` (a job heartbeat on the
    consumer's loop would stall whenever every slot is busy)."""

    def __init__(self, rt: Runtime, name: str) -> None:
        self.redis = rt.redis
        self.name = name
        self.queue = rt.settings.queue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._beat()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        with (
            contextlib.suppress(RedisConnectionError, RedisTimeoutError),
            self.redis.pipeline(transaction=False) as pipe,
        ):
            pipe.sadd(transport.workers_key(self.queue), self.name)
            pipe.set(
                transport.liveness_key(self.queue, self.name),
                "1",
                px=int(transport.LIVENESS_TTL_SECONDS * 1000),
            )
            pipe.execute()

    def _run(self) -> None:
        while not self._stop.wait(transport.LIVENESS_BEAT_SECONDS):
            self._beat()

    def stop(self, returned: list[str], *, in_flight: int) -> None:
        """Stop beating. With nothing left in flight the worker leaves the list; with calls
        still running past the grace period, its taken hash stays, and a sweeper dispatches
        them again once the liveness key expires."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        taken = transport.taken_key(self.queue, self.name)
        with self.redis.pipeline(transaction=False) as pipe:
            if returned:
                pipe.hdel(taken, *returned)
            pipe.delete(transport.liveness_key(self.queue, self.name))
            if in_flight == 0:
                pipe.delete(taken)
                pipe.srem(transport.workers_key(self.queue), self.name)
            pipe.execute()
