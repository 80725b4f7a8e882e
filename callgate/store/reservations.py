"""The guarantees, one SQL statement each: reserve, renew, refuse, reject, reuse, conclude.

- ``reserve``: one guarded UPDATE; exactly one of N competing workers gets a row back. A
  lease that has expired is taken over with ``generation + 1`` (the fencing token).
- ``renew``: extends the lease only for the same owner and generation (``renew_many``: the
  same for many leases in one statement, each with the same guard; it never waits for a row
  another transaction has locked, so no lock on one operation delays another's lease).
- complete: see ``completions`` (a write's fenced completion, alone or in a batch).
- ``conclude``: ends an operation whose owner's lease expired without running anything
  again (an intent that changed during a crash gap, a call out of dispatches), guarded on
  the generation the caller saw.
- ``abandon``: ends one call whose operation nobody holds (out of dispatches).
- ``refuse``: a gate refusal decided on server state (business rule, authorization, approval
  denied). It ends the *operation* with the refusal, guarded on ``state = 'pending'``, so it
  serialises with ``reserve`` on the operation row: a refusal can never overwrite a call whose
  operation another delivery already reserved or finished.
- ``reject`` / ``reuse``: end one call without running anything (a refusal decided on the call
  alone: allowlist, JSON, schema; or a result the operation already has), with the same
  outbox and trace in the same statement. ``reject`` ends only a call still ``proposed``,
  and ``reserve`` locks the call row first, so a refusal and a reservation of one call
  cannot both win.

Lock order: every statement that locks both locks the calls first (in id order when it
locks several), then the operation, so no two of them can deadlock. Each statement is safe
to repeat: a connection lost after its commit is retried (``db.retry_transient``), and a
repeat that finds its own earlier commit reports it as its own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from sqlalchemy import Connection, Engine, text

from callgate.core.types import TERMINAL_STATES
from callgate.store import db, histories
from callgate.store.endings import (
    CALL_RESULT,
    FINISH_TAIL,
    OPERATION_TAIL,
    Finished,
    result_body,
    storing,
)

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
           attempts = attempts + 1,
           first_sent_at = coalesce(first_sent_at, now())
     WHERE operation_id = :operation_id
       AND (intent_hash IS NULL OR intent_hash = :intent_hash)
       AND (state = 'pending' OR (state = 'in_progress' AND lease_expires_at < now()))
       -- never start a handler for a call that has already ended
       AND EXISTS (SELECT 1 FROM live)
    RETURNING operation_id, generation, reserved_from,
              extract(epoch FROM now() - first_sent_at)::float8 AS key_age
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
-- the history's epoch, the high half of the fencing token (the statement trigger on
-- operations refused this statement unless the last history recorded is the server's)
SELECT generation, reserved_from, key_age,
       (SELECT max(epoch) FROM callgate.histories) AS epoch
  FROM op
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

# ``RENEW_SQL`` for many leases in one statement: each row has exactly RENEW_SQL's guard.
#
# Why these locks. The UPDATE needs only FOR NO KEY UPDATE (it changes no key column), and that
# is all the batch takes: a submit that reuses an in-flight operation id holds FOR KEY SHARE on
# its row (the foreign-key check of its new call) until it commits, which FOR UPDATE would wait
# for; NO KEY UPDATE does not conflict with it, so a stalled submit can neither block a renewal
# nor deadlock with one (its FK checks lock in call order, not operation id order).
#
# SKIP LOCKED: one statement renews every lease a worker has due, so a row another transaction
# holds more strongly (a completion or a takeover in progress, a long transaction) must not
# make the others wait. The batch renews every row it can lock at once and never waits; a
# lease whose guard still holds (read without a lock, below) but whose row was skipped comes
# back as ``renewed = false`` and is renewed on its own with a short lock wait
# (``RENEW_LOCK_WAIT_MS``, see ``renew_many``). Since the batch never waits, the order it
# locks in no longer matters.
RENEW_MANY_SQL = """
WITH lease AS (
    SELECT * FROM unnest(CAST(:operation_ids AS text[]), CAST(:owner_tokens AS uuid[]),
                         CAST(:generations AS integer[]), CAST(:lease_seconds AS float8[]))
           AS l(operation_id, owner_token, generation, lease_seconds)
), guarded AS (
    SELECT o.operation_id, lease.owner_token, lease.generation, lease.lease_seconds
      FROM callgate.operations AS o
      JOIN lease ON lease.operation_id = o.operation_id
     WHERE o.state = 'in_progress'
       AND o.owner_token = lease.owner_token
       AND o.generation = lease.generation
), held AS (
    SELECT o.operation_id, guarded.owner_token, guarded.generation, guarded.lease_seconds
      FROM callgate.operations AS o
      JOIN guarded ON guarded.operation_id = o.operation_id
     WHERE o.state = 'in_progress'
       AND o.owner_token = guarded.owner_token
       AND o.generation = guarded.generation
       FOR NO KEY UPDATE OF o SKIP LOCKED
), renewed AS (
    UPDATE callgate.operations AS o
       SET lease_expires_at = now() + make_interval(secs => held.lease_seconds)
      FROM held
     WHERE o.operation_id = held.operation_id
       AND o.state = 'in_progress'
       AND o.owner_token = held.owner_token
       AND o.generation = held.generation
    RETURNING o.operation_id, o.owner_token, o.generation
)
SELECT operation_id, owner_token, generation, true AS renewed FROM renewed
UNION ALL
SELECT operation_id, owner_token, generation, false AS renewed FROM guarded
 WHERE operation_id NOT IN (SELECT operation_id FROM held)
"""

# How long the renewal of one lease whose row another transaction has locked waits for that
# lock before it is left for the next round. Each skipped lease waits on its own, after every
# other lease of the batch is renewed: a lock on one operation delays only that one.
RENEW_LOCK_WAIT_MS = 200
BOUNDED_LOCK_WAIT_SQL = "SELECT set_config('lock_timeout', :lock_timeout, true)"


# Calls first, in id order, then the operation: the order every statement here locks in.
LOCK_CALLS = """
WITH locked AS (
    SELECT id FROM callgate.calls
     WHERE operation_id = :operation_id
       AND state IN ('proposed', 'started', 'awaiting_approval')
     ORDER BY id
       FOR UPDATE
)"""

# Every call a reservation of the operation started (the one that completes it, and any
# whose owner died in a crash gap): they all ran under the operation's intent.
FINISH_STARTED = f"""), finished AS (
    UPDATE callgate.calls AS c
       SET state = :status,
           result = {CALL_RESULT}
                    || CAST(:body AS jsonb),
           completed_at = now()
      FROM op
     WHERE c.operation_id = op.operation_id AND c.state = 'started'
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""

REFUSE_SQL = (
    LOCK_CALLS
    + f""", op AS (
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
       AND (SELECT count(*) FROM locked) >= 0  -- the calls are locked before this row
    RETURNING operation_id
), finished AS (
    -- This call. A terminal refusal is also the operation's outcome: other calls of it are
    -- dispatched again and reuse it when their intent matches.
    UPDATE callgate.calls AS c
       SET state = :status,
           result = {CALL_RESULT}
                    || CAST(:body AS jsonb),
           completed_at = now()
      FROM op
     WHERE c.id = :call_ref AND c.state IN ('proposed', 'started')
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + OPERATION_TAIL
    + ", (SELECT count(*) FROM op) AS won"
)

REJECT_SQL = (
    f"""
WITH finished AS (
    UPDATE callgate.calls AS c
       SET state = :status,
           result = {CALL_RESULT}
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
    f"""
WITH finished AS (
    UPDATE callgate.calls AS c
       SET state = op.result ->> 'status',
           result = {CALL_RESULT}
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

CONCLUDE_SQL = (
    LOCK_CALLS
    + """, op AS (
    UPDATE callgate.operations
       SET state = 'failed',
           result = CAST(:body AS jsonb),
           owner_token = NULL,
           lease_expires_at = NULL,
           completed_at = now()
     WHERE operation_id = :operation_id
       AND state = 'in_progress'
       AND lease_expires_at < now()
       AND generation = :generation
       AND (SELECT count(*) FROM locked) >= 0  -- the calls are locked before this row
    RETURNING operation_id
"""
    + FINISH_STARTED
    + OPERATION_TAIL
    + ", (SELECT count(*) FROM op) AS won"
)

ABANDON_SQL = (
    f"""
WITH target AS (
    SELECT id, operation_id FROM callgate.calls
     WHERE id = :call_ref AND state IN ('proposed', 'started')
       FOR UPDATE
), idle AS (
    -- Nobody holds the operation, and nobody can reserve it while this runs: a reservation
    -- would need the call row (locked above) and this row (shared-locked here).
    SELECT op.operation_id FROM callgate.operations AS op
     WHERE op.operation_id = (SELECT operation_id FROM target)
       AND op.state <> 'in_progress'
       FOR SHARE
), finished AS (
    UPDATE callgate.calls AS c
       SET state = 'failed_terminal',
           result = {CALL_RESULT}
                    || CAST(:body AS jsonb),
           completed_at = now()
      FROM target, idle
     WHERE c.id = target.id
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
)

WHY_LOST_SQL = """
SELECT op.state, op.intent_hash, op.generation, op.owner_token, op.reserved_from,
       coalesce(op.lease_expires_at < now(), false) AS lease_expired,
       coalesce(extract(epoch FROM now() - op.first_sent_at)::float8, 0) AS key_age,
       c.state AS call_state,
       (SELECT max(epoch) FROM callgate.histories) AS epoch
  FROM callgate.operations AS op
  JOIN callgate.calls AS c ON c.operation_id = op.operation_id
 WHERE op.operation_id = :operation_id AND c.id = :call_ref
"""

TRACE_SQL = """
INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
VALUES (:turn_id, :call_ref, :operation_id, :event, :generation, CAST(:detail AS jsonb))
"""


# Converted once for the pooled driver connection (``db.raw_autocommit``): the same SQL text.
_RESERVE = db.Statement(RESERVE_SQL)
_RENEW = db.Statement(RENEW_SQL)
_RENEW_MANY = db.Statement(RENEW_MANY_SQL)
_BOUNDED_LOCK_WAIT = db.Statement(BOUNDED_LOCK_WAIT_SQL)
_REFUSE = db.Statement(REFUSE_SQL)
_REJECT = db.Statement(REJECT_SQL)
_REUSE = db.Statement(REUSE_SQL)
_WHY_LOST = db.Statement(WHY_LOST_SQL)
_TRACE = db.Statement(TRACE_SQL)


@dataclass(frozen=True)
class Reserved:
    generation: int
    takeover: bool
    # Seconds since this operation's key was first sent (0 on the first reservation): read
    # off the clock, so not part of what makes two reservations the same.
    key_age_seconds: float = field(default=0.0, compare=False)
    # The PostgreSQL history the reservation was taken on (``store.histories``).
    epoch: int = 0

    @property
    def fencing_token(self) -> int:
        """What the downstream sees: never repeated, even across a failover that rewound
        the generation."""
        return histories.fencing_token(self.epoch, self.generation)


@dataclass(frozen=True)
class NotReserved:
    """Why a guarded statement matched no row: done (reuse), busy (another owner holds it),
    conflict (another intent holds the operation id), missing, or the call itself already
    ended (another delivery finished it). ``op_state``, ``call_state`` and
    ``lease_expired`` say what was read, so the caller can choose its next step."""

    reason: Literal["done", "busy", "conflict", "missing", "ended"]
    generation: int = 0
    op_state: str = ""
    call_state: str = ""
    lease_expired: bool = False


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
    params = {
        "operation_id": operation_id,
        "call_ref": call_ref,
        "turn_id": turn_id,
        "owner_token": owner_token,
        "intent_hash": intent_hash,
        "canonical": json.dumps(dict(canonical or {})),
        "lease_seconds": lease_seconds,
        "detail": json.dumps(detail or {}),
    }

    def attempt() -> Reserved | NotReserved:
        with db.raw_autocommit(engine) as conn:
            row = conn.first(_RESERVE, params)
            if row is not None:
                return Reserved(
                    row.generation,
                    takeover=row.reserved_from == "in_progress",
                    key_age_seconds=float(row.key_age or 0.0),
                    epoch=int(row.epoch or 0),
                )
            return why_lost(
                conn,
                operation_id=operation_id,
                call_ref=call_ref,
                intent_hash=intent_hash,
                owner_token=owner_token,
            )

    return db.retry_transient(attempt)


def why_lost(
    conn: Connection | db.RawConnection,
    *,
    operation_id: str,
    call_ref: uuid.UUID,
    intent_hash: str,
    owner_token: uuid.UUID | None = None,
) -> Reserved | NotReserved:
    """Read why a guarded statement matched no row, only to choose what this delivery does
    next. Nothing changes state on the strength of this read. A reservation that already
    carries ``owner_token`` is this delivery's own, committed by an attempt whose reply was
    lost."""
    params = {"operation_id": operation_id, "call_ref": call_ref}
    if isinstance(conn, db.RawConnection):
        op = conn.first(_WHY_LOST, params)
    else:
        op = conn.execute(text(WHY_LOST_SQL), params).first()
    if op is None:
        return NotReserved("missing")
    if owner_token is not None and op.owner_token == owner_token and op.state == "in_progress":
        return Reserved(
            op.generation,
            takeover=op.reserved_from == "in_progress",
            key_age_seconds=float(op.key_age or 0.0),
            epoch=int(op.epoch or 0),
        )
    seen = {
        "generation": op.generation,
        "op_state": op.state,
        "call_state": op.call_state,
        "lease_expired": bool(op.lease_expired),
    }
    if op.call_state in TERMINAL_STATES:
        return NotReserved("ended", **seen)
    if op.intent_hash is not None and op.intent_hash != intent_hash:
        return NotReserved("conflict", **seen)
    if op.state in ("succeeded", "failed"):
        return NotReserved("done", **seen)
    return NotReserved("busy", **seen)


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


LeaseKey = tuple[str, uuid.UUID, int]  # (operation_id, owner_token, generation)


@dataclass(frozen=True)
class Renewal:
    """What ``renew_many`` found. ``renewed``: extended now. ``busy``: still this owner's,
    but another transaction held the row's lock past ``RENEW_LOCK_WAIT_MS``: neither renewed
    nor lost (the owner tries again next round; the lease's own expiry still counts). Any
    other lease asked for was taken over or finished: its owner must stop counting on it."""

    renewed: set[LeaseKey]
    busy: set[LeaseKey]


def renew_many(conn: db.RawConnection, leases: list[tuple[Lease, float]]) -> Renewal:
    """Renew each ``(lease, lease_seconds)`` that its owner still holds: every unlocked row in
    one statement that never waits, then each locked one on its own with a short lock wait
    (see ``RENEW_MANY_SQL``)."""
    seconds = {lease.operation_id: float(s) for lease, s in leases}
    rows = conn.execute(
        _RENEW_MANY,
        {
            "operation_ids": [lease.operation_id for lease, _ in leases],
            "owner_tokens": [lease.owner_token for lease, _ in leases],
            "generations": [lease.generation for lease, _ in leases],
            "lease_seconds": [float(s) for _, s in leases],
        },
    )
    renewed = {(r.operation_id, r.owner_token, r.generation) for r in rows if r.renewed}
    busy: set[LeaseKey] = set()
    for r in sorted((r for r in rows if not r.renewed), key=lambda r: r.operation_id):
        key = (r.operation_id, r.owner_token, r.generation)
        params = {
            "operation_id": r.operation_id,
            "owner_token": r.owner_token,
            "generation": r.generation,
            "lease_seconds": seconds[r.operation_id],
        }
        try:
            with conn.driver.transaction():
                conn.execute(_BOUNDED_LOCK_WAIT, {"lock_timeout": f"{RENEW_LOCK_WAIT_MS}ms"})
                if conn.first(_RENEW, params) is not None:
                    renewed.add(key)
        except psycopg.errors.LockNotAvailable:
            busy.add(key)
    return Renewal(renewed, busy)


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
    params = {
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
    }

    def attempt() -> Finished | NotReserved:
        with db.raw_autocommit(engine) as conn:
            row = conn.one(_REFUSE, params)
            if row.won:
                return Finished(row.finished, list(row.successors))
            lost = why_lost(
                conn, operation_id=operation_id, call_ref=call_ref, intent_hash=intent_hash
            )
            assert isinstance(lost, NotReserved)  # no owner token: never our reservation
            return lost

    return storing(attempt)


def reject(
    engine: Engine,
    *,
    call_ref: uuid.UUID,
    status: str,
    error: dict[str, Any],
    detail: dict[str, Any] | None = None,
) -> Finished:
    """End one call that the gate refused. Nothing was reserved; nothing ran."""
    params = {
        "call_ref": call_ref,
        "status": status,
        "body": result_body(status, error),
        "event": "rejected",
        "generation": None,
        "detail": json.dumps(detail or {}),
    }
    return storing(lambda: _finish_statement(engine, _REJECT, params))


def reuse(
    engine: Engine, *, call_ref: uuid.UUID, intent_hash: str, detail: dict[str, Any] | None = None
) -> Finished:
    """End one call with the result its operation already committed (a redelivery)."""
    params = {
        "call_ref": call_ref,
        "intent_hash": intent_hash,
        "event": "result_reused",
        "generation": None,
        "detail": json.dumps(detail or {}),
    }
    return storing(lambda: _finish_statement(engine, _REUSE, params))


def conclude(
    conn: Connection,
    *,
    operation_id: str,
    generation: int,
    error: dict[str, Any],
    event: str,
    detail: dict[str, Any] | None = None,
) -> Finished:
    """End an operation whose owner's lease expired at ``generation``, and every call it
    started, with a terminal error; nothing runs again. ``won`` is False when someone took
    the operation over or finished it first."""
    row = conn.execute(
        text(CONCLUDE_SQL),
        {
            "operation_id": operation_id,
            "generation": generation,
            "status": "failed_terminal",
            "body": result_body("failed_terminal", error),
            "event": event,
            "detail": json.dumps(detail or {}),
        },
    ).one()
    return Finished(row.finished, list(row.successors), won=bool(row.won))


def abandon(
    conn: Connection,
    *,
    call_ref: uuid.UUID,
    error: dict[str, Any],
    event: str,
    detail: dict[str, Any] | None = None,
) -> Finished:
    """End one open call whose operation nobody holds, with a terminal error."""
    row = conn.execute(
        text(ABANDON_SQL),
        {
            "call_ref": call_ref,
            "body": result_body("failed_terminal", error),
            "event": event,
            "generation": None,
            "detail": json.dumps(detail or {}),
        },
    ).one()
    return Finished(row.finished, list(row.successors))


def _finish_statement(engine: Engine, sql: db.Statement, params: dict[str, Any]) -> Finished:
    with db.raw_autocommit(engine) as conn:
        row = conn.one(sql, params)
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
    with db.raw_autocommit(engine) as conn:
        conn.execute(
            _TRACE,
            {
                "turn_id": turn_id,
                "call_ref": call_ref,
                "operation_id": operation_id,
                "event": event,
                "generation": generation,
                "detail": json.dumps(detail or {}),
            },
        )
