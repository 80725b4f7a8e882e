"""The guarantees, one SQL statement each: reserve, renew, complete, reject, reuse.

- ``reserve``: one guarded UPDATE; exactly one of N competing workers gets a row back. A
  lease that has expired is taken over with ``generation + 1`` (the fencing token).
- ``renew``: extends the lease only for the same owner and generation.
- ``complete``: requires state ``in_progress`` and the same intent, owner and generation; in
  the same statement it writes the result, every open call of the operation, their outbox
  rows and trace events, and wakes the relayer. No row means a stale owner: nothing changes.
- ``refuse``: a gate refusal decided on server state (business rule, authorization, approval
  denied). It ends the *operation* with the refusal, guarded on ``state = 'pending'``, so it
  serialises with ``reserve`` on the operation row: a refusal can never overwrite a call whose
  operation another delivery already reserved or finished.
- ``reject`` / ``reuse``: end one call without running anything (a refusal decided on the call
  alone: allowlist, JSON, schema; or a result the operation already has), with the same
  outbox and trace in the same statement. ``reject`` ends only a call still ``proposed``,
  and ``reserve`` locks the call row first, so a refusal and a reservation of one call
  cannot both win.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, text

from store import db
from store.types import TERMINAL_STATES

RESERVE_SQL = """
WITH live AS (
    -- Lock the call first: a concurrent refusal of this call (which updates the same row)
    -- either commits before, and then the call is no longer open here, or waits for us.
    SELECT id FROM callgate.calls
     WHERE id = :call_ref AND state IN ('proposed', 'started')
       FOR UPDATE
), op AS (
    UPDATE callgate.operations
       SET state = 'in_progress',
           owner_token = :owner_token,
           generation = generation + 1,
           intent_hash = :intent_hash,
           canonical = CAST(:canonical AS jsonb),
           reserved_from = state,
           lease_expires_at = now() + make_interval(secs => :lease_seconds),
           attempts = attempts + 1
     WHERE operation_id = :operation_id
       AND (intent_hash IS NULL OR intent_hash = :intent_hash)
       AND (state = 'pending' OR (state = 'in_progress' AND lease_expires_at < now()))
       -- never start a handler for a call that has already ended
       AND EXISTS (SELECT 1 FROM live)
    RETURNING operation_id, generation, reserved_from
), started AS (
    UPDATE callgate.calls AS c
       SET state = 'started'
      FROM op
     WHERE c.id = :call_ref AND c.state = 'proposed'
    RETURNING c.id
), traced AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
    SELECT CAST(:turn_id AS uuid), CAST(:call_ref AS uuid), op.operation_id,
           CASE WHEN op.reserved_from = 'in_progress' THEN 'takeover' ELSE 'reserved' END,
           op.generation,
           jsonb_build_object('intent_hash', CAST(:intent_hash AS text)) || CAST(:detail AS jsonb)
      FROM op
)
SELECT generation, reserved_from FROM op
"""

RENEW_SQL = """
UPDATE callgate.operations
   SET lease_expires_at = now() + make_interval(secs => :lease_seconds)
 WHERE operation_id = :operation_id
   AND state = 'in_progress'
   AND owner_token = :owner_token
   AND generation = :generation
RETURNING lease_expires_at
"""

# The tail shared by every statement that ends calls: `finished` holds the calls just made
# terminal (id, turn_id, result, status). Their outbox rows, trace events, the relayer's
# wake-up and the next write of each turn are written in the same statement.
FINISH_TAIL = """
, outboxed AS (
    INSERT INTO callgate.outbox (turn_id, call_ref, payload)
    SELECT turn_id, id, result FROM finished
    RETURNING id
), traced AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
    SELECT turn_id, id, operation_id, CAST(:event AS text), CAST(:generation AS integer),
           jsonb_build_object('status', status, 'code', result #>> '{error,code}')
             || CAST(:detail AS jsonb)
      FROM finished
), woken AS (
    SELECT pg_notify('callgate_outbox', '') FROM (SELECT 1 FROM outboxed LIMIT 1) AS any_row
), successors AS (
    UPDATE callgate.calls AS s
       SET dispatched_at = now(), dispatches = s.dispatches + 1
      FROM finished
     WHERE s.after_call = finished.id AND s.state = 'proposed'
    RETURNING s.id
)
SELECT (SELECT count(*) FROM finished) AS finished,
       (SELECT count(*) FROM woken) AS woken,
       (SELECT coalesce(array_agg(id), '{}') FROM successors) AS successors
"""

COMPLETE_SQL = (
    """
WITH op AS (
    UPDATE callgate.operations
       SET state = :op_state,
           result = CASE WHEN CAST(:op_state AS text) = 'pending' THEN NULL
                         ELSE CAST(:body AS jsonb) END,
           owner_token = NULL,
           lease_expires_at = NULL,
           completed_at = now()
     WHERE operation_id = :operation_id
       AND state = 'in_progress'
       AND intent_hash = :intent_hash
       AND owner_token = :owner_token
       AND generation = :generation
    RETURNING operation_id
), finished AS (
    UPDATE callgate.calls AS c
       SET state = :status,
           result = jsonb_build_object('call_id', c.call_id, 'tool_name', c.tool_name)
                    || CAST(:body AS jsonb),
           completed_at = now()
      FROM op
     WHERE c.operation_id = op.operation_id
       AND c.state IN ('proposed', 'started', 'awaiting_approval')
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
    + ", (SELECT count(*) FROM op) AS won"
)

REFUSE_SQL = (
    """
WITH op AS (
    UPDATE callgate.operations
       SET state = :op_state,
           intent_hash = CASE WHEN CAST(:op_state AS text) = 'pending' THEN intent_hash
                              ELSE CAST(:intent_hash AS text) END,
           canonical = CASE WHEN CAST(:op_state AS text) = 'pending' THEN canonical
                            ELSE CAST(:canonical AS jsonb) END,
           result = CASE WHEN CAST(:op_state AS text) = 'pending' THEN NULL
                         ELSE CAST(:body AS jsonb) END,
           completed_at = now()
     WHERE operation_id = :operation_id
       AND state = 'pending'
       AND (intent_hash IS NULL OR intent_hash = :intent_hash)
    RETURNING operation_id
), finished AS (
    UPDATE callgate.calls AS c
       SET state = :status,
           result = jsonb_build_object('call_id', c.call_id, 'tool_name', c.tool_name)
                    || CAST(:body AS jsonb),
           completed_at = now()
      FROM op
     WHERE c.operation_id = op.operation_id
       AND c.state IN ('proposed', 'started', 'awaiting_approval')
       -- a retryable refusal ends only this call; a terminal one is the operation's outcome
       AND (CAST(:op_state AS text) <> 'pending' OR c.id = :call_ref)
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
    + ", (SELECT count(*) FROM op) AS won"
)

REJECT_SQL = (
    """
WITH finished AS (
    UPDATE callgate.calls AS c
       SET state = :status,
           result = jsonb_build_object('call_id', c.call_id, 'tool_name', c.tool_name)
                    || CAST(:body AS jsonb),
           completed_at = now()
     -- Only a call no delivery has started: a started call belongs to the reservation
     -- that started it, whose completion gives it its result.
     WHERE c.id = :call_ref AND c.state = 'proposed'
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
)

REUSE_SQL = (
    """
WITH finished AS (
    UPDATE callgate.calls AS c
       SET state = op.result ->> 'status',
           result = jsonb_build_object('call_id', c.call_id, 'tool_name', c.tool_name)
                    || op.result,
           completed_at = now()
      FROM callgate.operations AS op
     WHERE c.id = :call_ref AND c.state IN ('proposed', 'started')
       AND op.operation_id = c.operation_id
       AND op.state IN ('succeeded', 'failed')
       AND op.intent_hash = :intent_hash
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
)

WHY_LOST_SQL = """
SELECT op.state, op.intent_hash, op.generation, c.state AS call_state
  FROM callgate.operations AS op
  JOIN callgate.calls AS c ON c.operation_id = op.operation_id
 WHERE op.operation_id = :operation_id AND c.id = :call_ref
"""

TRACE_SQL = """
INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
VALUES (:turn_id, :call_ref, :operation_id, :event, :generation, CAST(:detail AS jsonb))
"""


@dataclass(frozen=True)
class Reserved:
    generation: int
    takeover: bool


@dataclass(frozen=True)
class NotReserved:
    """Why the reservation failed: done (reuse), busy (another live owner), conflict, or the
    call itself already ended (another delivery finished it)."""

    reason: Literal["done", "busy", "conflict", "missing", "ended"]
    generation: int = 0


@dataclass(frozen=True)
class Finished:
    finished: int
    successors: list[uuid.UUID]
    won: bool = True


@dataclass(frozen=True)
class Lease:
    operation_id: str
    owner_token: uuid.UUID
    generation: int
    intent_hash: str


def reserve(
    engine: Engine,
    *,
    operation_id: str,
    call_ref: uuid.UUID,
    turn_id: uuid.UUID,
    owner_token: uuid.UUID,
    intent_hash: str,
    lease_seconds: float,
    canonical: Mapping[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
) -> Reserved | NotReserved:
    with db.autocommit(engine) as conn:
        row = conn.execute(
            text(RESERVE_SQL),
            {
                "operation_id": operation_id,
                "call_ref": call_ref,
                "turn_id": turn_id,
                "owner_token": owner_token,
                "intent_hash": intent_hash,
                "canonical": json.dumps(dict(canonical or {})),
                "lease_seconds": lease_seconds,
                "detail": json.dumps(detail or {}),
            },
        ).first()
        if row is not None:
            return Reserved(row.generation, takeover=row.reserved_from == "in_progress")
        return why_lost(conn, operation_id=operation_id, call_ref=call_ref, intent_hash=intent_hash)


def why_lost(
    conn: Connection, *, operation_id: str, call_ref: uuid.UUID, intent_hash: str
) -> NotReserved:
    """Read why a guarded statement matched no row, only to choose what this delivery does
    next. Nothing changes state on the strength of this read."""
    op = conn.execute(
        text(WHY_LOST_SQL), {"operation_id": operation_id, "call_ref": call_ref}
    ).first()
    if op is None:
        return NotReserved("missing")
    if op.call_state in TERMINAL_STATES:
        return NotReserved("ended", op.generation)
    if op.intent_hash is not None and op.intent_hash != intent_hash:
        return NotReserved("conflict", op.generation)
    if op.state in ("succeeded", "failed"):
        return NotReserved("done", op.generation)
    return NotReserved("busy", op.generation)


def renew(conn: Connection, lease: Lease, lease_seconds: float) -> bool:
    row = conn.execute(
        text(RENEW_SQL),
        {
            "operation_id": lease.operation_id,
            "owner_token": lease.owner_token,
            "generation": lease.generation,
            "lease_seconds": lease_seconds,
        },
    ).first()
    return row is not None


def result_body(status: str, payload: dict[str, Any]) -> str:
    """``{"status", "data"}`` or ``{"status", "error"}``: a result without its call's ids."""
    key = "data" if status == "succeeded" else "error"
    return json.dumps({"status": status, key: payload})


def complete(
    engine: Engine,
    lease: Lease,
    *,
    status: str,
    payload: dict[str, Any],
    detail: dict[str, Any] | None = None,
) -> Finished:
    """Commit the outcome iff this owner still holds this generation. Else change nothing."""
    assert status in TERMINAL_STATES
    # A retryable failure ends the call but leaves the operation open for a later retry.
    op_state = {"succeeded": "succeeded", "failed_terminal": "failed"}.get(status, "pending")
    with db.autocommit(engine) as conn:
        row = conn.execute(
            text(COMPLETE_SQL),
            {
                "operation_id": lease.operation_id,
                "owner_token": lease.owner_token,
                "generation": lease.generation,
                "intent_hash": lease.intent_hash,
                "op_state": op_state,
                "status": status,
                "body": result_body(status, payload),
                "event": "completed",
                "detail": json.dumps(detail or {}),
            },
        ).one()
    return Finished(row.finished, list(row.successors), won=bool(row.won))


def refuse(
    engine: Engine,
    *,
    operation_id: str,
    call_ref: uuid.UUID,
    intent_hash: str,
    status: str,
    error: dict[str, Any],
    canonical: Mapping[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
) -> Finished | NotReserved:
    """End the operation with a gate refusal iff nobody reserved or finished it first."""
    op_state = "failed" if status == "failed_terminal" else "pending"
    with db.autocommit(engine) as conn:
        row = conn.execute(
            text(REFUSE_SQL),
            {
                "operation_id": operation_id,
                "call_ref": call_ref,
                "intent_hash": intent_hash,
                "canonical": json.dumps(dict(canonical or {})),
                "op_state": op_state,
                "status": status,
                "body": result_body(status, error),
                "event": "refused",
                "generation": None,
                "detail": json.dumps(detail or {}),
            },
        ).one()
        if row.won:
            return Finished(row.finished, list(row.successors))
        return why_lost(conn, operation_id=operation_id, call_ref=call_ref, intent_hash=intent_hash)


def reject(
    engine: Engine,
    *,
    call_ref: uuid.UUID,
    status: str,
    error: dict[str, Any],
    detail: dict[str, Any] | None = None,
) -> Finished:
    """End one call that the gate refused. Nothing was reserved; nothing ran."""
    with db.autocommit(engine) as conn:
        row = conn.execute(
            text(REJECT_SQL),
            {
                "call_ref": call_ref,
                "status": status,
                "body": result_body(status, error),
                "event": "rejected",
                "generation": None,
                "detail": json.dumps(detail or {}),
            },
        ).one()
    return Finished(row.finished, list(row.successors))


def reuse(
    engine: Engine, *, call_ref: uuid.UUID, intent_hash: str, detail: dict[str, Any] | None = None
) -> Finished:
    """End one call with the result its operation already committed (a redelivery)."""
    with db.autocommit(engine) as conn:
        row = conn.execute(
            text(REUSE_SQL),
            {
                "call_ref": call_ref,
                "intent_hash": intent_hash,
                "event": "result_reused",
                "generation": None,
                "detail": json.dumps(detail or {}),
            },
        ).one()
    return Finished(row.finished, list(row.successors))


def trace(
    engine: Engine,
    *,
    event: str,
    turn_id: uuid.UUID | None,
    call_ref: uuid.UUID | None,
    operation_id: str | None,
    generation: int | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """A counted event that changes no state (duplicate delivery, stale owner, …)."""
    with db.autocommit(engine) as conn:
        conn.execute(
            text(TRACE_SQL),
            {
                "turn_id": turn_id,
                "call_ref": call_ref,
                "operation_id": operation_id,
                "event": event,
                "generation": generation,
                "detail": json.dumps(detail or {}),
            },
        )
