"""The sweeper: brings back calls that Redis or a dead worker dropped.

RQ moves a killed job to its failed registry and never re-runs it, and a job lost on Redis
is simply gone. Postgres knows better: a call that is not terminal is re-dispatched when
- its operation's lease expired (the owner died or stalled) and it was not dispatched since;
- or nobody holds its operation, its predecessor (if any) is terminal, and it has waited
  longer than ``stale_seconds`` since its last dispatch (a lost enqueue, a lost job);
- or it waits for an approval request that is no longer pending (a call that parked while
  the request was being decided): it goes back to ``proposed`` and runs the gate again,
  which resumes it, denies it or asks again.
Re-dispatch is safe: the reservation CAS lets one delivery run and the others count as
duplicates.
"""

from __future__ import annotations

import logging
import threading
import uuid

from rq import Queue
from sqlalchemy import Engine, text

from store import db, transport

log = logging.getLogger("callgate.sweeper")

DUE_SQL = """
WITH due AS (
    SELECT c.id
      FROM callgate.calls AS c
      JOIN callgate.operations AS op USING (operation_id)
      LEFT JOIN callgate.calls AS prev ON prev.id = c.after_call
     WHERE (c.state IN ('proposed', 'started')
       AND (
             (op.state = 'in_progress' AND op.lease_expires_at < now()
              AND (c.dispatched_at IS NULL OR c.dispatched_at < op.lease_expires_at))
          OR (op.state <> 'in_progress'
              AND (prev.id IS NULL
                   OR prev.state IN ('succeeded', 'failed_retryable', 'failed_terminal'))
              AND (c.dispatched_at IS NULL
                   OR c.dispatched_at < now() - make_interval(secs => :stale_seconds)))
           ))
        OR (c.state = 'awaiting_approval'
            AND EXISTS (SELECT 1 FROM callgate.approvals AS a
                         WHERE a.approval_id = c.approval_id AND a.state <> 'pending'))
     ORDER BY c.dispatched_at NULLS FIRST
     LIMIT :batch
       FOR UPDATE OF c SKIP LOCKED
)
UPDATE callgate.calls AS c
   SET dispatched_at = now(), dispatches = c.dispatches + 1,
       state = CASE WHEN c.state = 'awaiting_approval' THEN 'proposed' ELSE c.state END
  FROM due
 WHERE c.id = due.id
RETURNING c.id
"""


def sweep_once(
    engine: Engine, queue: Queue, *, stale_seconds: float, job_timeout: float, batch: int = 100
) -> list[uuid.UUID]:
    """Mark due calls dispatched and enqueue them. A crash in between only delays them."""
    with db.autocommit(engine) as conn:
        refs = [
            row.id
            for row in conn.execute(text(DUE_SQL), {"stale_seconds": stale_seconds, "batch": batch})
        ]
    if refs:
        transport.enqueue_calls(queue, refs, timeout=job_timeout)
        log.info("sweeper re-dispatched %d call(s)", len(refs))
    return refs


def run(
    engine: Engine,
    queue: Queue,
    *,
    interval: float,
    stale_seconds: float,
    job_timeout: float,
    stop: threading.Event | None = None,
) -> None:
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            sweep_once(engine, queue, stale_seconds=stale_seconds, job_timeout=job_timeout)
        except Exception as exc:  # a sweep that fails is retried on the next tick
            log.warning("sweeper: %s", exc)
        stop.wait(interval)
