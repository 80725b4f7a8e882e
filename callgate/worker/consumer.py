"""A worker process's consumer: takes call refs off callgate's RQ queue, K at a time.

Why not RQ's own worker loop: it runs one job at a time per process, and most of a no-op
call's time goes to per-job bookkeeping (started and finished registries, job heartbeats,
results) that callgate does not need: Postgres holds every call's state, lease and result,
and the sweeper dispatches again whatever is lost. The queue stays RQ's (producers enqueue
with ``Queue.enqueue_many``; ``rq info`` shows the queue and these workers); this consumer
reads it with two Redis round trips per batch of jobs and deletes each job as it takes it.

Each call runs on a thread of its own, with its own lease, heartbeat, fence and completion;
up to ``concurrency`` handlers run at once. A call whose handler has returned gives its slot
to the next call while its ending commits (batched with others, a few milliseconds): with
slow tools a slot would otherwise sit idle for that commit, then for the take and load of
the call after it, on every call. ``stop()`` (SIGTERM) stops taking calls and waits for the
ones in flight up to a grace period; a SIGKILL loses nothing that Postgres does not still
know about.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from redis.exceptions import RedisError
from rq import SimpleWorker

from callgate.core.errors import ServiceUnavailable
from callgate.observe import metrics
from callgate.queue import deliveries, rq_format
from callgate.store import calls, db
from callgate.worker import executor, group_commit, heartbeat
from callgate.worker.runtime import Runtime

log = logging.getLogger("callgate.worker")

POLL_SECONDS = 1.0
REGISTRATION_HEARTBEAT_SECONDS = 60.0
# A delivery that failed because PostgreSQL or Redis was unreachable is made again by the same
# worker, up to this many deliveries in all, this long apart.
OUTAGE_DELIVERIES = 3
OUTAGE_PAUSE_SECONDS = 1.0
# With calls in flight, how long the consumer waits for half its slots to be free before it
# takes more (at most: a slot that frees alone is filled after this long).
GATHER_SECONDS = 0.002


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
        self.in_flight = 0  # deliveries begun and not finished, their endings' commits included
        self.done = 0
        # Job ids of the deliveries holding a slot: taken, and the ending not yet handed in.
        self._handling: set[str] = set()
        self._taking = 0  # slots the take under way will fill
        self._waiting = 0  # deliveries made again, waiting for a slot
        self._slots = threading.Condition()
        self._stopping = threading.Event()
        self._stop_requested_at: float | None = None
        # Calls still running when the grace period ended: their leases are no longer renewed,
        # and the process must exit without waiting for them (see ``process.run``).
        self.abandoned = 0
        # Registered with RQ only so that `rq info` and Worker.all() see this process.
        self._registration = SimpleWorker(
            [rt.queue], connection=rt.redis, name=name, serializer=rq_format.SERIALIZER
        )
        self.name: str = self._registration.name
        queue = rt.settings.queue
        self._keys = [
            self.queue_key,
            deliveries.taking_key(queue, self.name),
            deliveries.taken_key(queue, self.name),
        ]
        self._job_prefix = rq_format.JOB_KEY_PREFIX
        self._take_script = rt.redis.register_script(deliveries.TAKE_LUA)
        # Job ids whose deliveries returned: dropped from the taken hash on the next take.
        self._returned: list[str] = []
        # Job ids whose deliveries run now (submitted, not yet returned).
        self._running: set[str] = set()
        # A take script call failed: its reply may have been lost after the script took jobs
        # into the taken hash, so the next take first looks there for jobs it never got.
        self._reconcile = False
        self._liveness = deliveries.Liveness(rt.redis, rt.settings.queue, self.name)
        self._endings = group_commit.for_engine(rt.engine)
        self._endings.window_seconds = rt.settings.worker_commit_window_ms / 1000

    def stop(self) -> None:
        """Take no more calls; the ones in flight finish (within the grace period, counted
        from the first request to stop)."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stopping.set()
        with self._slots:
            self._slots.notify_all()

    def run(self) -> None:
        # Listed and alive before RQ sees us: whoever waits for a registered worker (the
        # stack, an operator's `rq info`) finds its liveness key there too.
        self._liveness.start()
        self._registration.register_birth()  # type: ignore[no-untyped-call]
        # A thread for each slot, and one for each ending still committing after its slot
        # went to the next call.
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="call")
        next_heartbeat = time.monotonic() + REGISTRATION_HEARTBEAT_SECONDS
        try:
            while not self._stopping.is_set():
                free = self._wait_for_free_slot()
                if free == 0:
                    continue
                try:
                    taken = self._start_calls(free, pool)
                except RedisError as exc:
                    # Redis is down or restarting, or refuses for now (READONLY after a
                    # failover, OOM, loading): keep the calls in flight, try again. What Redis
                    # held meanwhile is re-dispatched from Postgres by the sweeper.
                    log.warning("cannot take calls from Redis (%s: %s); retrying", _name(exc), exc)
                    self._stopping.wait(POLL_SECONDS)
                    continue
                if not taken and self.burst and self.in_flight == 0:
                    break
                if time.monotonic() >= next_heartbeat:
                    with contextlib.suppress(RedisError):
                        self._registration.heartbeat()
                    next_heartbeat = time.monotonic() + REGISTRATION_HEARTBEAT_SECONDS
        finally:
            self.abandoned = self._drain()
            if self.abandoned:
                # Before anything else: past the grace no lease of this process moves again,
                # so the calls it leaves are taken over when their leases run out.
                heartbeat.stop_renewing(self.rt.engine)
            pool.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(RedisError):
                self._liveness.stop(self._pop_returned())
                self._registration.register_death()  # type: ignore[no-untyped-call]

    def _start_calls(self, free: int, pool: ThreadPoolExecutor) -> int:
        """Take up to ``free`` calls and start each on ``pool``; how many were taken."""
        try:
            refs = self._take(free)
            if refs:
                metrics.calls_taken(len(refs))
            loaded = self._load([ref for _, ref in refs])
            for job_id, ref in refs:
                with self._slots:
                    self.in_flight += 1
                    self._running.add(job_id)
                    self._handling.add(job_id)
                    self._taking -= 1
                metrics.WORKER_IN_FLIGHT.inc()
                # Counted from now: a read that ends first waits (briefly) for these.
                ticket = self._endings.enter()
                ticket.on_handed = functools.partial(self._release, job_id)
                pool.submit(self._run_one, job_id, ref, loaded.get(ref), ticket)
            return len(refs)
        finally:
            self._done_taking()

    @property
    def threads(self) -> int:
        return 2 * self.concurrency

    def _free(self) -> int:
        """Slots free now for calls off the queue (caller holds ``_slots``): a delivery made
        again that waits for a slot has the next one."""
        return min(
            self.concurrency - len(self._handling) - self._waiting,
            self.threads - self.in_flight,
        )

    def _done_taking(self) -> None:
        with self._slots:
            self._taking = 0
            self._slots.notify_all()

    def _release(self, job_id: str) -> None:
        """The delivery's handler is done: its slot goes to the next call (once)."""
        with self._slots:
            held = job_id in self._handling
            self._handling.discard(job_id)
            self._slots.notify_all()
        if held:
            metrics.WORKER_IN_FLIGHT.dec()  # slots busy, not endings still committing

    def _take_slot(self, job_id: str) -> None:
        """Hold a slot again for a delivery made again (no-op if it still holds one)."""
        with self._slots:
            if job_id in self._handling:
                return
            self._waiting += 1
            try:
                while len(self._handling) + self._taking >= self.concurrency:
                    self._slots.wait(POLL_SECONDS)
            finally:
                self._waiting -= 1
            self._handling.add(job_id)
        metrics.WORKER_IN_FLIGHT.inc()

    def _wait_for_free_slot(self) -> int:
        with self._slots:
            while self._free() <= 0 and not self._stopping.is_set():
                self._slots.wait(POLL_SECONDS)
            # Busy: let more slots free, briefly, so that one take, one load and one ending
            # statement serve several calls instead of one each.
            deadline = time.monotonic() + GATHER_SECONDS
            want = max(1, self.concurrency // 2)
            while (
                self._handling
                and self._free() < want
                and not self._stopping.is_set()
                and (left := deadline - time.monotonic()) > 0
            ):
                self._slots.wait(left)
            if self._stopping.is_set():
                return 0
            # Kept for the take until its calls hold them (or it ends): a delivery made again
            # waits for a slot, and must not take one this take is about to fill.
            # A delivery made again may have taken a slot while this waited: none may be left.
            self._taking = max(0, self._free())
            return self._taking

    def _take(self, count: int) -> list[tuple[str, uuid.UUID]]:
        """Up to ``count`` (job id, call ref): whatever is queued now, else wait briefly for
        one. Each job taken is recorded in this worker's taken hash in the same atomic step,
        so a sweeper can dispatch it again if this process dies before it finishes."""
        refs = self._reclaim(count) if self._reconcile else []
        if len(refs) == count:
            return refs
        returned = self._pop_returned()
        replies = self._call_take_script(count - len(refs), returned)
        if not replies and not refs and not (self.burst and self.in_flight == 0):
            # Wait for a job: BLMOVE keeps it on Redis (the taking list) until the script
            # takes it, so no moment exists where only this process knows of it.
            moved = self.rt.redis.blmove(
                self._keys[0], self._keys[1], int(POLL_SECONDS), "LEFT", "RIGHT"
            )
            if moved:
                replies = self._call_take_script(count, [])
        return refs + self._refs(list(zip(replies[::2], replies[1::2], strict=True)))

    def _call_take_script(self, count: int, returned: list[str]) -> list[bytes]:
        try:
            replies: list[bytes] = self._take_script(
                keys=self._keys, args=[count, self._job_prefix, *returned]
            )
        except BaseException:
            # The script may have run with its reply lost: the ids it was to drop are sent
            # again (dropping one twice is harmless), and the jobs it may have taken are
            # looked for in the taken hash before the next take.
            with self._slots:
                self._returned[:0] = returned
            self._reconcile = True
            raise
        return replies

    def _reclaim(self, count: int) -> list[tuple[str, uuid.UUID]]:
        """Jobs in this worker's taken hash that this process does not know it took (a take
        whose reply was lost), up to ``count``. Only this thread adds to the hash, so what is
        there and neither running nor returned was taken by a script whose reply never came."""
        with self._slots:
            known = self._running | set(self._returned)
        held = cast(dict[bytes, bytes], self.rt.redis.hgetall(self._keys[2]))
        stranded = [(job_id, data) for job_id, data in held.items() if job_id.decode() not in known]
        if len(stranded) <= count:
            self._reconcile = False  # all found; else the rest on the next take
        if stranded:
            log.warning(
                "found %d call(s) this worker took without receiving them (a lost reply "
                "from Redis); running them now",
                min(len(stranded), count),
            )
        return self._refs(stranded[:count])

    def _refs(self, jobs: list[tuple[bytes, bytes]]) -> list[tuple[str, uuid.UUID]]:
        refs = []
        for job_id, data in jobs:
            ref = deliveries.call_ref(data)
            if ref is not None:
                refs.append((job_id.decode(), ref))
            else:
                with self._slots:
                    self._returned.append(job_id.decode())
        return refs

    def _pop_returned(self) -> list[str]:
        with self._slots:
            returned, self._returned = self._returned, []
        return returned

    def _load(self, refs: list[uuid.UUID]) -> dict[uuid.UUID, calls.CallRecord]:
        """The records of a take's calls in one round trip (two or more of them). Any it
        cannot read now, each delivery reads on its own, with its own retries."""
        if len(refs) < 2:
            return {}
        try:
            return calls.load_many(self.rt.engine, refs)
        except Exception as exc:
            log.warning("cannot load %d taken call(s) together (%s); one by one", len(refs), exc)
            return {}

    def _run_one(
        self,
        job_id: str,
        ref: uuid.UUID,
        loaded: calls.CallRecord | None = None,
        ticket: group_commit.Ticket | None = None,
    ) -> None:
        try:
            for attempt in range(1, OUTAGE_DELIVERIES + 1):
                try:
                    if attempt == 1:
                        executor.execute(self.rt, ref, loaded, ticket)
                    else:
                        # Its slot may have gone to another call with its ending: the
                        # handler may run again, so it waits for a slot of its own.
                        self._take_slot(job_id)
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
                    if _outage(exc):  # expected: a long outage, not a bug (no traceback)
                        log.warning(
                            "delivery of call %s met an outage %d times (%s); left open for "
                            "the sweeper",
                            ref,
                            attempt,
                            exc,
                        )
                    else:
                        log.exception("delivery of call %s failed", ref)
                    break
        finally:
            if ticket is not None:
                self._endings.leave(ticket)
            self._release(job_id)
            with self._slots:
                self._running.discard(job_id)
                self._returned.append(job_id)
                self.in_flight -= 1
                self.done += 1
                self._slots.notify_all()

    def _drain(self) -> int:
        """Wait for the calls in flight until the grace period ends, and past it for the
        results still being committed (while their leases may hold); the count still running."""
        start = self._stop_requested_at or time.monotonic()
        deadline = start + self.grace_seconds
        with self._slots:
            while self.in_flight and time.monotonic() < deadline:
                self._slots.wait(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        if self.in_flight and self.rt.held.count:
            # A handler that returned holds the only copy of its result (a write's, which
            # may have applied) until its completion commits; PostgreSQL being away at the
            # moment must not make the worker drop it. The completion retries for a lease.
            lease = self.rt.settings.lease_seconds
            log.warning(
                "%d result(s) not yet committed at the end of the %g s grace period "
                "(PostgreSQL unreachable?); waiting for them up to the lease (%g s)",
                self.rt.held.count,
                self.grace_seconds,
                lease,
            )
            running = self.in_flight - self.rt.held.count  # handlers still running
            self.rt.held.wait_released(time.monotonic() + lease + HELD_SLACK_SECONDS)
            with self._slots:  # the completed calls' threads leave in_flight just after
                settle = time.monotonic() + 1.0
                while self.in_flight > running and time.monotonic() < settle:
                    self._slots.wait(0.05)
        with self._slots:
            if self.in_flight:
                log.warning(
                    "%d call(s) still running after the %g s grace period; their leases are "
                    "no longer renewed, this worker exits, and another worker takes them over "
                    "once the leases expire",
                    self.in_flight,
                    self.grace_seconds,
                )
            return self.in_flight


# Past the lease a completion retries for, how long a stopping worker still waits for it.
HELD_SLACK_SECONDS = 2.0


def _outage(exc: BaseException) -> bool:
    return isinstance(exc, ServiceUnavailable) or db.is_transient(exc)


def _name(exc: BaseException) -> str:
    return type(exc).__name__
