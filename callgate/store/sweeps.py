"""The sweeper's statements: which open calls are due, which of them are lost, and the
marks of a dispatch. The sweeper (``callgate.daemons.sweeper``) decides with Redis what is
lost; these run inside its transactions, so a mark commits only with the enqueue it
records."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

# Two index-backed halves: open calls (calls_open: ``is_open`` is state IN ('proposed',
# 'started')), and parked calls (calls_awaiting: ``is_awaiting`` is state =
# 'awaiting_approval'). Terminal history is never scanned. ``last`` is when the call was last
# dispatched or last found waiting in Redis (queued_seen_at), whichever is later.
DUE_SQL = """
WITH candidates AS (
    SELECT c.id
      FROM callgate.calls AS c
      JOIN callgate.operations AS op USING (operation_id)
      LEFT JOIN callgate.calls AS prev ON prev.id = c.after_call
      CROSS JOIN LATERAL (SELECT greatest(c.dispatched_at, c.queued_seen_at) AS at) AS last
     WHERE c.is_open
       AND (
             -- its owner's lease expired and nothing was dispatched (or seen queued) since
             (op.state = 'in_progress' AND op.lease_expires_at < now()
              AND (last.at IS NULL
                   OR last.at < greatest(op.lease_expires_at,
                                         now() - make_interval(secs => :stale_seconds))))
          OR (op.state <> 'in_progress'
              AND (prev.id IS NULL
                   OR prev.state IN ('succeeded', 'failed_retryable', 'failed_terminal'))
              AND (
                    -- the stale rule: nothing heard of it for a stale period
                    last.at IS NULL
                 OR last.at < now() - make_interval(secs => :stale_seconds)
                    -- the next write of a turn whose previous write ended a grace period
                    -- ago, not dispatched (nor seen queued) since: the completion that
                    -- marked it may have died before its enqueue reached Redis
                 OR (prev.completed_at < now() - make_interval(secs => :successor_grace)
                     AND last.at <= prev.completed_at)
                  ))
           )
    UNION ALL
    SELECT c.id
      FROM callgate.calls AS c
      JOIN callgate.approvals AS a ON a.approval_id = c.approval_id
     WHERE c.is_awaiting AND a.state <> 'pending'
)
SELECT c.id, c.state, c.kind, c.dispatches, c.operation_id,
       op.state AS op_state, op.generation,
       -- a job taken longer ago than the job timeout is no longer waiting (a hung read)
       coalesce(greatest(c.dispatched_at, c.queued_seen_at)
                < now() - make_interval(secs => :job_timeout), false) AS overdue
  FROM callgate.calls AS c
  JOIN candidates USING (id)
  JOIN callgate.operations AS op USING (operation_id)
 WHERE c.state IN ('proposed', 'started', 'awaiting_approval')
 ORDER BY c.dispatched_at NULLS FIRST
 LIMIT :batch
   FOR UPDATE OF c SKIP LOCKED
"""

# A due call whose job Redis still holds is waiting, not lost: it is neither dispatched
# again (no duplicate piles up in the queue) nor counted against its dispatch budget.
# Noting when it was seen keeps it out of the next sweeps for a stale period.
SEEN_QUEUED_SQL = """
UPDATE callgate.calls SET queued_seen_at = now() WHERE id = ANY(:refs)
"""

MARK_SQL = """
UPDATE callgate.calls
   SET dispatched_at = now(), dispatches = dispatches + 1,
       state = CASE WHEN state = 'awaiting_approval' THEN 'proposed' ELSE state END
 WHERE id = ANY(:refs)
"""

# Open calls nobody holds among ``refs`` (the calls a dead worker had taken) or, without
# ``refs``, every one dispatched before ``since`` (the moment Redis was found empty). An
# operation in progress is left out: its lease decides who runs it (the lease clause of
# DUE_SQL brings it back once the lease expired). A call out of dispatches is left to
# DUE_SQL, which ends it.
LOST_SQL = """
SELECT c.id
  FROM callgate.calls AS c
  JOIN callgate.operations AS op USING (operation_id)
  LEFT JOIN callgate.calls AS prev ON prev.id = c.after_call
 WHERE c.is_open  -- state IN ('proposed', 'started'): the calls_open index
   AND (CAST(:refs AS uuid[]) IS NULL OR c.id = ANY(CAST(:refs AS uuid[])))
   AND (CAST(:since AS timestamptz) IS NULL
        OR c.dispatched_at IS NULL OR c.dispatched_at < CAST(:since AS timestamptz))
   AND op.state <> 'in_progress'
   AND (prev.id IS NULL OR prev.state IN ('succeeded', 'failed_retryable', 'failed_terminal'))
   AND c.dispatches < :max_dispatches
 ORDER BY c.dispatched_at NULLS FIRST
 LIMIT :batch
   FOR UPDATE OF c SKIP LOCKED
"""


def due(
    conn: Connection,
    *,
    stale_seconds: float,
    successor_grace: float,
    job_timeout: float,
    batch: int,
) -> list[Any]:
    """Due calls, locked (``SKIP LOCKED``) for the rest of the transaction."""
    params = {
        "stale_seconds": stale_seconds,
        "successor_grace": successor_grace,
        "job_timeout": job_timeout,
        "batch": batch,
    }
    return list(conn.execute(text(DUE_SQL), params))


def seen_queued(conn: Connection, refs: list[uuid.UUID]) -> None:
    conn.execute(text(SEEN_QUEUED_SQL), {"refs": refs})


def mark_dispatched(conn: Connection, refs: list[uuid.UUID]) -> None:
    conn.execute(text(MARK_SQL), {"refs": refs})


def lost(
    conn: Connection,
    *,
    refs: list[uuid.UUID] | None,
    since: Any,
    max_dispatches: int,
    batch: int,
) -> list[uuid.UUID]:
    params = {"refs": refs, "since": since, "max_dispatches": max_dispatches, "batch": batch}
    return [r.id for r in conn.execute(text(LOST_SQL), params)]


def operation_tool(conn: Connection, operation_id: str) -> str:
    row = conn.execute(
        text("SELECT tool_name FROM callgate.operations WHERE operation_id = :o"),
        {"o": operation_id},
    ).scalar_one()
    return str(row)


# The Redis history a queue's sweepers saw last (epoch key and replication id). A process
# records what it sees now; only a value different from the recorded one is written, and
# then ``changed_at`` moves and ``replaced`` says a history was lost. Concurrent recorders
# of one new value: the row lock makes one of them write it, the others find it equal.
RECORD_EPOCH_SQL = """
INSERT INTO callgate.redis_epochs AS e (queue, epoch)
VALUES (:queue, :epoch)
ON CONFLICT (queue) DO UPDATE
   SET epoch = EXCLUDED.epoch, changed_at = now(), replaced = true
 WHERE e.epoch <> EXCLUDED.epoch
"""

RECORDED_EPOCH_SQL = """
SELECT epoch, changed_at, replaced FROM callgate.redis_epochs WHERE queue = :queue
"""


@dataclass(frozen=True)
class RecordedEpoch:
    """The Redis history recorded for a queue, and, if it replaced an earlier one, when:
    every open call not dispatched since then may have lost its job."""

    epoch: str
    lost_since: Any | None


def record_epoch(engine: Engine, queue: str, epoch: str) -> RecordedEpoch:
    """Record ``epoch`` as the queue's Redis history, and return what is recorded now (a
    concurrent sweeper may have recorded a newer one in between)."""
    with engine.begin() as conn:
        conn.execute(text(RECORD_EPOCH_SQL), {"queue": queue, "epoch": epoch})
        row = conn.execute(text(RECORDED_EPOCH_SQL), {"queue": queue}).one()
    return RecordedEpoch(row.epoch, row.changed_at if row.replaced else None)
