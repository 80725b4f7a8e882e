"""The sweeper: brings back calls that Redis or a dead worker dropped, and ends the ones
that can never finish.

RQ moves a killed job to its failed registry and never re-runs it, and a job lost on Redis
is simply gone. Postgres knows better. An open call is due when
- its operation's lease expired (the owner died or stalled), and it was not dispatched
  since the lease expired or in the last ``stale_seconds``: a re-dispatched job that is lost
  too is dispatched again, as often as it takes;
- or nobody holds its operation, its predecessor (if any) is terminal, and it has waited
  longer than ``stale_seconds`` since its last dispatch (a lost enqueue, a lost job);
- or it waits for an approval request that is no longer pending (a call that parked while
  the request was being decided): it goes back to ``proposed`` and runs the gate again,
  which resumes it, denies it or asks again.

A due call is marked and enqueued in one transaction: the mark commits only after Redis
took the jobs, so a sweep while Redis is down changes nothing and the next one tries again.
Re-dispatch is safe: the reservation CAS lets one delivery run and the others count as
duplicates.

A call dispatched ``max_dispatches`` times that is still open (a job that kills its worker
every time, a completion that can never commit) is not dispatched again: it ends with
``delivery_exhausted``, or ``reconciliation_pending`` if it is a write whose operation was
started, since that write may have applied.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from rq import Queue
from sqlalchemy import Connection, Engine, text

from callgate.store import db, logs, metrics, reservations, transport
from callgate.store.errors import ErrorCode

log = logging.getLogger("callgate.sweeper")

# Two index-backed halves: open calls by their last dispatch (calls_open), and parked calls
# (calls_awaiting). Terminal history is never scanned.
DUE_SQL = """
WITH candidates AS (
    SELECT c.id
      FROM callgate.calls AS c
      JOIN callgate.operations AS op USING (operation_id)
      LEFT JOIN callgate.calls AS prev ON prev.id = c.after_call
     WHERE c.state IN ('proposed', 'started')
       AND (
             (op.state = 'in_progress' AND op.lease_expires_at < now()
              AND (c.dispatched_at IS NULL
                   OR c.dispatched_at < greatest(op.lease_expires_at,
                                                 now() - make_interval(secs => :stale_seconds))))
          OR (op.state <> 'in_progress'
              AND (prev.id IS NULL
                   OR prev.state IN ('succeeded', 'failed_retryable', 'failed_terminal'))
              AND (c.dispatched_at IS NULL
                   OR c.dispatched_at < now() - make_interval(secs => :stale_seconds)))
           )
    UNION ALL
    SELECT c.id
      FROM callgate.calls AS c
      JOIN callgate.approvals AS a ON a.approval_id = c.approval_id
     WHERE c.state = 'awaiting_approval' AND a.state <> 'pending'
)
SELECT c.id, c.state, c.kind, c.dispatches, c.operation_id,
       op.state AS op_state, op.generation
  FROM callgate.calls AS c
  JOIN candidates USING (id)
  JOIN callgate.operations AS op USING (operation_id)
 WHERE c.state IN ('proposed', 'started', 'awaiting_approval')
 ORDER BY c.dispatched_at NULLS FIRST
 LIMIT :batch
   FOR UPDATE OF c SKIP LOCKED
"""

MARK_SQL = """
UPDATE callgate.calls
   SET dispatched_at = now(), dispatches = dispatches + 1,
       state = CASE WHEN state = 'awaiting_approval' THEN 'proposed' ELSE state END
 WHERE id = ANY(:refs)
"""


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


def sweep_once(
    engine: Engine,
    queue: Queue,
    *,
    stale_seconds: float,
    job_timeout: float,
    max_dispatches: int,
    batch: int = 100,
) -> Sweep:
    """Re-dispatch due calls; end those out of dispatches. Returns what it did."""
    with engine.begin() as conn:
        due = [
            _Due(r.id, r.state, r.kind, r.dispatches, r.operation_id, r.op_state, r.generation)
            for r in conn.execute(text(DUE_SQL), {"stale_seconds": stale_seconds, "batch": batch})
        ]
        spent = [
            d for d in due if d.state != "awaiting_approval" and d.dispatches >= max_dispatches
        ]
        redo = [d for d in due if d not in spent]
        again = [d.ref for d in redo]
        if again:
            conn.execute(text(MARK_SQL), {"refs": again})
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
    if due.op_state == "in_progress":
        # Its owner's lease expired: the handler started and may have applied.
        error = exhausted
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
            tool = conn.execute(
                text("SELECT tool_name FROM callgate.operations WHERE operation_id = :o"),
                {"o": due.operation_id},
            ).scalar_one()
            metrics.write_operation_completed(str(tool))
    else:
        finished = reservations.abandon(
            conn, call_ref=due.ref, error=exhausted, event="delivery_exhausted", detail=detail
        )
    metrics.exhausted(error["code"], finished.finished)
    logs.event(log, error["code"], logging.WARNING, call_ref=due.ref, operation_id=due.operation_id)
    if finished.successors:
        try:
            transport.enqueue_calls(queue, finished.successors, timeout=job_timeout)
        except Exception as exc:  # they are marked dispatched: a later sweep retries them
            log.warning("sweeper: %s", exc)
    return finished.finished > 0


def _error(code: ErrorCode, message: str) -> dict[str, Any]:
    return {"code": code.value, "details": [{"code": code.value, "message": message}]}


def run(
    engine: Engine,
    queue: Queue,
    *,
    interval: float,
    stale_seconds: float,
    job_timeout: float,
    max_dispatches: int,
    stop: threading.Event | None = None,
) -> None:
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            sweep_once(
                engine,
                queue,
                stale_seconds=stale_seconds,
                job_timeout=job_timeout,
                max_dispatches=max_dispatches,
            )
        except Exception as exc:  # a sweep that fails is retried on the next tick
            log.warning("sweeper: %s", exc)
        stop.wait(interval)
