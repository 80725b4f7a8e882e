"""The sweeper: brings back calls that Redis or a dead worker dropped, and ends the ones
that can never finish.

RQ moves a killed job to its failed registry and never re-runs it, and a job lost on Redis
is simply gone. Postgres knows better. An open call is due when
- its operation's lease expired (the owner died or stalled), and it was not dispatched
  since the lease expired or in the last ``stale_seconds``: a re-dispatched job that is lost
  too is dispatched again, as often as it takes;
- or nobody holds its operation, its predecessor (if any) is terminal, and it has waited
  longer than ``stale_seconds`` since its last dispatch (a lost enqueue, a lost job);
- or nobody holds it and its predecessor ended more than ``successor_grace`` seconds ago
  without it being dispatched since (the worker that ended the predecessor marked it
  dispatched and died before its enqueue reached Redis);
- or it waits for an approval request that is no longer pending (a call that parked while
  the request was being decided): it goes back to ``proposed`` and runs the gate again,
  which resumes it, denies it or asks again.

Due is not lost. A call's job id is its ref, so one round trip per batch asks Redis where
each due call's job is: still waiting in the queue, or taken by a live worker (for a call
nobody holds), the call is in a backlog, not lost; it is not enqueued again (no duplicates
pile up), not counted against ``max_dispatches``, only noted as seen (``queued_seen_at``,
which keeps it out of the next sweeps for ``stale_seconds``). A backlog never ends a call.

A lost call is marked and enqueued in one transaction: the mark commits only after Redis
took the jobs, so a sweep while Redis is down changes nothing and the next one tries again.
Re-dispatch is safe: the reservation CAS lets one delivery run and the others count as
duplicates.

Faster than ``stale_seconds``, two kinds of loss are noticed from Redis (``recover_lost``):
- a worker whose liveness key expired (it died, or stalled for seconds): the calls it had
  taken off the queue are dispatched again at once. Those it had reserved are left to their
  leases, which alone decide who may run a reserved call; fencing keeps a stalled owner that
  wakes up harmless;
- Redis that lost its data (FLUSHALL, a restart without persistence), noticed by its epoch
  key being gone or changed, and Redis that may have lost its latest writes (a replica
  promoted by Sentinel, which had not received them; a restart), noticed by its
  replication id changing (``deliveries.RedisEpoch``). The last value seen is recorded in
  Postgres (``callgate.redis_epochs``), so the process that notices a new one may have
  started after the loss, and every open call nobody holds is dispatched again once per
  loss, whichever and however many processes sweep: each dispatches only the calls not
  dispatched since the loss was recorded.

Every worker process sweeps too (on a thread, ``CALLGATE_WORKER_SWEEP``), so recovery does
not depend on the sweeper process; several sweepers at once are safe (``SKIP LOCKED``, and a
duplicate dispatch is only counted).

A call dispatched ``max_dispatches`` times that is still open and lost (a job that kills
its worker every time, a completion that can never commit) is not dispatched again: it ends with
``delivery_exhausted``, or ``reconciliation_pending`` if it is a write whose operation was
started, since that write may have applied.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from rq import Queue

from callgate.core import logs
from callgate.core.errors import ErrorCode
from callgate.daemons import failover
from callgate.observe import metrics
from callgate.queue import deliveries, transport
from callgate.store import db, reservations, sweeps
from callgate.store.db import Connection, Engine

log = logging.getLogger("callgate.sweeper")


@dataclass(frozen=True)
class Sweep:
    dispatched: list[uuid.UUID]
    ended: list[uuid.UUID]


@dataclass(frozen=True)
class _Due:
    ref: uuid.UUID
    state: str
    kind: str
    dispatches: int
    operation_id: str
    op_state: str
    generation: int
    overdue: bool = False


def sweep_once(
    engine: Engine,
    queue: Queue,
    *,
    stale_seconds: float,
    job_timeout: float,
    max_dispatches: int,
    successor_grace: float = 5.0,
    batch: int = 100,
) -> Sweep:
    """Re-dispatch due calls whose delivery is lost; end those out of dispatches. Returns
    what it did. A due call whose job Redis still holds is only noted (``SEEN_QUEUED_SQL``)."""
    with engine.begin() as conn:
        due = [
            _Due(
                r.id,
                r.state,
                r.kind,
                r.dispatches,
                r.operation_id,
                r.op_state,
                r.generation,
                r.overdue,
            )
            for r in sweeps.due(
                conn,
                stale_seconds=stale_seconds,
                successor_grace=successor_grace,
                job_timeout=job_timeout,
                batch=batch,
            )
        ]
        # One round trip for the batch, inside the transaction: if Redis cannot answer,
        # nothing is marked and the next sweep asks again.
        states = deliveries.job_states(
            queue, [d.ref for d in due if d.state != "awaiting_approval"]
        )
        waiting = [d for d in due if _waiting(d, states.get(d.ref))]
        lost = [d for d in due if d not in waiting]
        spent = [
            d for d in lost if d.state != "awaiting_approval" and d.dispatches >= max_dispatches
        ]
        redo = [d for d in lost if d not in spent]
        again = [d.ref for d in redo]
        if waiting:
            sweeps.seen_queued(conn, [d.ref for d in waiting])
        if again:
            sweeps.mark_dispatched(conn, again)
            # Inside the transaction: if Redis refuses, the marks roll back with it.
            transport.enqueue_calls(queue, again, timeout=job_timeout)
    for d in redo:  # counted once the marks committed with the enqueue
        metrics.redispatched(_reason(d))
        logs.event(log, "redispatched", call_ref=d.ref, operation_id=d.operation_id, state=d.state)
    ended: list[uuid.UUID] = []
    for d in spent:
        with db.autocommit(engine) as conn:
            if _end(conn, queue, d, max_dispatches, job_timeout):
                ended.append(d.ref)
    if again:
        log.info("sweeper re-dispatched %d call(s)", len(again))
    if ended:
        log.warning("sweeper ended %d call(s) out of dispatches", len(ended))
    return Sweep(again, ended)


def _waiting(due: _Due, job: str | None) -> bool:
    """Is the delivery of a due call still under way in Redis? Its job waits in the queue;
    or, for a call nobody holds, a live worker has taken it (and has not returned it) less
    than a job timeout ago: a read runs with no lease, and one that hangs is dispatched
    again once the job timeout has passed, as a reserved call whose handler hangs is taken
    over. A call whose lease expired is taken over even if a live worker still lists it:
    the lease alone decides who runs a reserved call, and that worker has stopped renewing
    it."""
    if job == "queued":
        return True
    return job == "taken" and due.op_state != "in_progress" and not due.overdue


def _reason(due: _Due) -> str:
    """Why a call is due again, as ``callgate_sweeper_redispatches_total`` labels it."""
    if due.state == "awaiting_approval":
        return "approval_decided"
    if due.op_state == "in_progress":
        return "lease_expired"
    return "stale"


def _end(
    conn: Connection, queue: Queue, due: _Due, max_dispatches: int, job_timeout: float
) -> bool:
    """End one call that was dispatched ``max_dispatches`` times and is still open."""
    exhausted = _error(
        ErrorCode.DELIVERY_EXHAUSTED, f"dispatched {max_dispatches} times without finishing"
    )
    detail = {"dispatches": due.dispatches}
    error = exhausted
    if due.op_state == "in_progress":
        # Its owner's lease expired: the handler started and may have applied.
        if due.kind == "write":
            error = _error(
                ErrorCode.RECONCILIATION_PENDING,
                "the write may have applied; a person must reconcile it",
            )
        finished = reservations.conclude(
            conn,
            operation_id=due.operation_id,
            generation=due.generation,
            error=error,
            event="delivery_exhausted",
            detail=detail,
        )
        if finished.won and due.kind == "write":
            # The operation ends here, once: the other side of the side-effect ratio. (Its
            # tool was registered: the operation was reserved.)
            metrics.write_operation_completed(sweeps.operation_tool(conn, due.operation_id))
    else:
        finished = reservations.abandon(
            conn, call_ref=due.ref, error=exhausted, event="delivery_exhausted", detail=detail
        )
    metrics.exhausted(error["code"], finished.finished)
    logs.event(log, error["code"], logging.WARNING, call_ref=due.ref, operation_id=due.operation_id)
    # They are marked dispatched: if Redis refuses, a later sweep dispatches them.
    transport.dispatch_after_commit(queue, finished.successors, timeout=job_timeout, who="sweeper")
    return finished.finished > 0


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"code": code.value, "details": [{"code": code.value, "message": message}]}


def _redispatch_lost(
    engine: Engine,
    queue: Queue,
    *,
    refs: list[uuid.UUID] | None,
    since: Any,
    job_timeout: float,
    max_dispatches: int,
    reason: str,
    batch: int = 500,
) -> list[uuid.UUID]:
    """Mark and enqueue lost calls (see LOST_SQL), batch by batch, each batch in one
    transaction that commits only once Redis took its jobs."""
    done: list[uuid.UUID] = []
    while True:
        with engine.begin() as conn:
            again = sweeps.lost(
                conn, refs=refs, since=since, max_dispatches=max_dispatches, batch=batch
            )
            if again:
                sweeps.mark_dispatched(conn, again)
                transport.enqueue_calls(queue, again, timeout=job_timeout)
        for _ in again:
            metrics.redispatched(reason)
        done.extend(again)
        # A marked call has dispatched_at = now() >= since: the next batch skips it. With
        # refs, one batch holds them all (a taken hash holds at most a worker's slots).
        if len(again) < batch or refs is not None:
            return done


def recover_lost(
    engine: Engine,
    queue: Queue,
    *,
    job_timeout: float,
    max_dispatches: int,
    epoch: deliveries.RedisEpoch | None = None,
) -> list[uuid.UUID]:
    """Dispatch again, without waiting for ``stale_seconds``, the calls Redis lost (its
    epoch changed from the one recorded in Postgres; ``epoch`` spares the comparison while
    this process's last value holds) and the calls taken by workers whose liveness key
    expired. Returns the calls dispatched."""
    conn: redis.Redis = queue.connection
    name = queue.name
    dispatched: list[uuid.UUID] = []
    epoch = epoch or deliveries.RedisEpoch()
    current = epoch.look(conn, name)
    if current is not None:
        # A value this process has not settled: Postgres says whether it replaced another
        # one, and since when. Every sweeper that notices the same loss dispatches again only
        # the calls not dispatched since that moment, so a call lost once is dispatched once
        # more, however many processes sweep; a process that just started notices a loss
        # that happened while it was down. If this fails, the next sweep tries again.
        recorded = sweeps.record_epoch(engine, name, current)
        if recorded.epoch == current:
            if recorded.lost_since is not None:
                lost = _redispatch_lost(
                    engine,
                    queue,
                    refs=None,
                    since=recorded.lost_since,
                    job_timeout=job_timeout,
                    max_dispatches=max_dispatches,
                    reason="redis_lost",
                )
                if lost:
                    log.warning(
                        "Redis lost its data or changed history (a flush, a restart, a "
                        "failover): re-dispatched %d open call(s)",
                        len(lost),
                    )
                dispatched.extend(lost)
            epoch.seen = current
    for worker in deliveries.dead_workers(conn, name):
        # One sweeper recovers a worker at a time. The worker leaves the list only once its
        # calls are dispatched again: a sweeper that dies (or fails) midway leaves it listed,
        # and another one recovers it once the claim expires.
        if not deliveries.claim_recovery(conn, name, worker):
            continue
        dispatched.extend(_recover_worker(engine, queue, worker, job_timeout, max_dispatches))
        deliveries.forget_worker(conn, name, worker)
    return dispatched


def _recover_worker(
    engine: Engine, queue: Queue, worker: str, job_timeout: float, max_dispatches: int
) -> list[uuid.UUID]:
    conn: redis.Redis = queue.connection
    # Jobs it had moved to wait on but not yet taken go back to the queue as they are.
    deliveries.return_taking(queue, worker)
    taken, refs = deliveries.taken_calls(conn, queue.name, worker)
    again: list[uuid.UUID] = []
    if refs:
        again = _redispatch_lost(
            engine,
            queue,
            refs=refs,
            since=None,
            job_timeout=job_timeout,
            max_dispatches=max_dispatches,
            reason="worker_lost",
        )
    # Only what was read above is removed (not the whole hash): a worker that was only slow
    # (stopped, paused) may wake up meanwhile and take more, and those stay listed.
    deliveries.forget_taken(conn, queue.name, worker, taken)
    if refs:
        log.warning(
            "worker %s stopped beating: re-dispatched %d of the %d call(s) it had taken",
            worker,
            len(again),
            len(refs),
        )
    else:
        log.info("worker %s stopped beating; it held no call", worker)
    return again


def run(
    engine: Engine,
    queue: Queue,
    *,
    interval: float,
    stale_seconds: float,
    job_timeout: float,
    max_dispatches: int,
    successor_grace: float = 5.0,
    stop: threading.Event | None = None,
    jitter: float = 0.0,
) -> None:
    """Sweep every ``interval`` seconds until ``stop``. With ``jitter`` (a fraction), the
    first sweep waits a random part of an interval and each wait varies by that fraction, so
    the sweepers of a fleet of workers started together do not sweep in lockstep."""
    stop = stop or threading.Event()
    if jitter:
        stop.wait(random.uniform(0, interval))
    epoch = deliveries.RedisEpoch()
    while not stop.is_set():
        try:
            # First: until a new PostgreSQL history is reconciled nothing else can commit.
            failover.reconcile(engine, queue, job_timeout=job_timeout)
        except Exception as exc:  # retried on the next tick
            log.warning("sweeper: %s", exc)
        try:
            recover_lost(
                engine,
                queue,
                job_timeout=job_timeout,
                max_dispatches=max_dispatches,
                epoch=epoch,
            )
        except Exception as exc:  # retried on the next tick
            log.warning("sweeper: %s", exc)
        try:
            sweep_once(
                engine,
                queue,
                stale_seconds=stale_seconds,
                job_timeout=job_timeout,
                max_dispatches=max_dispatches,
                successor_grace=successor_grace,
            )
        except Exception as exc:  # a sweep that fails is retried on the next tick
            log.warning("sweeper: %s", exc)
        stop.wait(interval * random.uniform(1 - jitter, 1 + jitter))
