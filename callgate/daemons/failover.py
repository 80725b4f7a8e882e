"""Reconciling a new PostgreSQL history: after a failover to a replica, before any work.

Every sweeper (the sweeper process and each worker's sweeping thread) calls ``reconcile``
at the start of each sweep. On the history callgate last reconciled it is one indexed read.
On a new one (a promoted replica, a restore) the statement triggers already refuse every
statement that would record, reserve or end anything, and this:

1. records the history, numbered past every epoch recorded here and past the results fence
   in Redis (a replica promoted by a second failover may lack the first one's record), and
   puts in doubt every write that may have been reserved on the lost one
   (``store.histories.begin``);
2. raises the results fence in Redis to the new epoch, so a relayer still holding rows from
   the lost history can no longer publish them;
3. records as lost the turns Redis remembers being submitted that the history lacks, their
   writes' operation ids in doubt (``collect`` answers ``turn_lost``; a submit again under
   one of them is taken over);
4. reads what Redis holds for every open call's turn, and ends each call the lost history
   had already published a result for with exactly that result;
5. marks the history reconciled: work resumes.

A reconciler that dies midway leaves the history recorded but not reconciled; the next
sweep, in any process, resumes it from step 2.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from rq import Queue

from callgate.queue import results, transport
from callgate.store import histories
from callgate.store.db import Engine

log = logging.getLogger("callgate.failover")


@dataclass(frozen=True)
class Reconciled:
    epoch: int
    doubted: int
    adopted: int
    lost: int


def remembered(connection: redis.Redis, queue: str) -> list[histories.Remembered]:
    """The turns Redis remembers being submitted, with whose they were."""
    return [
        histories.Remembered(t.turn_id, t.tenant_id, t.at, t.writes, t.user_id)
        for t in results.recent(connection, queue)
    ]


def reconcile(engine: Engine, queue: Queue, *, job_timeout: float) -> Reconciled | None:
    """Reconcile the server's history if it is new; None when there was nothing to do."""
    if histories.epoch(engine) is not None:
        return None
    begun = histories.begin(engine, reached=results.fence(queue.connection, queue.name))
    if begun is None:
        return None
    log.warning(
        "PostgreSQL's history changed (a failover to a replica, or a restore): reconciling it "
        "as epoch %d; %d write(s) that may have run on the lost history are taken over",
        begun.epoch,
        begun.doubted,
    )
    results.raise_fence(queue.connection, queue.name, begun.epoch)
    held = results.published(queue.connection, queue.name, (c.turn_id for c in begun.open_calls))
    found = {
        c.id: held[(c.turn_id, c.call_id)]
        for c in begun.open_calls
        if (c.turn_id, c.call_id) in held
    }
    lost = histories.record_lost(engine, begun.epoch, remembered(queue.connection, queue.name))
    adopted = histories.adopt(engine, begun.epoch, found)
    # They are marked dispatched: if Redis refuses, a later sweep dispatches them.
    transport.dispatch_after_commit(
        queue, adopted.successors, timeout=job_timeout, who="reconciliation"
    )
    histories.finish(engine, begun.epoch)
    log.warning(
        "PostgreSQL history %d reconciled: %d call(s) ended with the result already published; "
        "%d turn(s) submitted were lost (collect answers turn_lost)",
        begun.epoch,
        adopted.ended,
        lost,
    )
    return Reconciled(begun.epoch, begun.doubted, adopted.ended, lost)
