"""A write's fenced completion, alone or with the writes finishing beside it: one statement.

``COMPLETE_MANY_SQL`` commits each completion whose owner still holds its lease: the
operation must still be ``in_progress`` under the same intent, owner token and generation,
or that row changes nothing (a stale owner, taken over meanwhile, is fenced out row by row
while the others commit). A row that wins moves its operation (a retryable failure puts it
back to ``pending``, so a later call with the same operation id can try again) and ends
every call the operation started, with their outbox rows, their ``completed`` trace events
(each with its own generation and detail), the relayer's wake-up and the dispatch of the
calls it unblocked: the next write of each turn, and other calls waiting on the operation
(each runs the gate and reuses the result if its intent matches, or gets
``idempotency_conflict``), all in the same statement.

Lock order is the one every statement keeps: the calls of all the batch's operations first,
in id order, then the operations. A deadlock abort (two batches whose operations have no
open call left to serialise them) is transient and retried.

A retry whose earlier attempt committed and lost its reply recognises its own rows by
operation, generation, state and stored result (``COMPLETED_MANY_BY_SQL``).

A batch of one is sent as ``COMPLETE_SQL``: the same guards and tail for one operation,
found by equality on its key (``COMPLETED_BY_SQL`` after a lost reply).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from callgate.core.errors import UnstorableValue
from callgate.core.types import TERMINAL_STATES
from callgate.store import db
from callgate.store.endings import (
    CALL_RESULT,
    NEXT_WRITE,
    OPERATION_TAIL,
    WAITING_ON_OPERATION,
    Finished,
    finishing_tail,
    result_body,
    storing,
)
from callgate.store.reservations import FINISH_STARTED, LOCK_CALLS, Lease

# The calls and operations are found by ``= ANY (ARRAY(…))``, an index condition, where a
# join would look cheaper as a sequential scan: the planner sizes a set-returning function at
# 100 rows.
_COMPLETING = """
WITH completing AS (
    SELECT * FROM jsonb_to_recordset(CAST(:completions AS jsonb))
           AS w(operation_id text, owner_token uuid, generation integer, intent_hash text,
                op_state text, status text, body jsonb, detail jsonb)
)"""

COMPLETE_MANY_SQL = (
    _COMPLETING
    + f""", locked AS (
    SELECT c.id FROM callgate.calls AS c
     WHERE c.operation_id = ANY (ARRAY(SELECT operation_id FROM completing))
       AND c.state IN ('proposed', 'started', 'awaiting_approval')
     ORDER BY c.id
       FOR UPDATE
), op AS (
    UPDATE callgate.operations AS o
       SET state = w.op_state,
           result = CASE WHEN w.op_state = 'pending' THEN NULL ELSE w.body END,
           owner_token = NULL,
           lease_expires_at = NULL,
           completed_at = now()
      FROM completing AS w
     WHERE o.operation_id = ANY (ARRAY(SELECT operation_id FROM completing))
       AND o.operation_id = w.operation_id
       AND o.state = 'in_progress'
       AND o.intent_hash = w.intent_hash
       AND o.owner_token = w.owner_token
       AND o.generation = w.generation
       AND (SELECT count(*) FROM locked) >= 0  -- the calls are locked before these rows
    RETURNING o.operation_id, o.generation, w.status, w.body, w.detail
), finished AS (
    UPDATE callgate.calls AS c
       SET state = op.status,
           result = {CALL_RESULT}
                    || op.body,
           completed_at = now()
      FROM op
     WHERE c.operation_id = op.operation_id AND c.state = 'started'
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status,
              op.generation, op.detail
), traced AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
    SELECT turn_id, id, operation_id, 'completed', generation,
           jsonb_build_object('status', status, 'code', result #>> '{{error,code}}') || detail
      FROM finished
)"""
    + finishing_tail(NEXT_WRITE + WAITING_ON_OPERATION, traced=False)
    + """, (SELECT coalesce(array_agg(operation_id || ':' || generation), '{}') FROM op) AS won,
       (SELECT coalesce(jsonb_object_agg(operation_id, n), '{}')
          FROM (SELECT operation_id, count(*) AS n FROM finished GROUP BY operation_id) AS f)
         AS ended"""
)

# Which of these completions an earlier attempt of this very statement committed (its reply
# lost): the operation still holds that generation's outcome.
COMPLETED_MANY_BY_SQL = (
    _COMPLETING
    + """
SELECT o.operation_id || ':' || o.generation AS key
  FROM callgate.operations AS o JOIN completing AS w USING (operation_id)
 WHERE o.generation = w.generation AND o.state = w.op_state
   AND o.result IS NOT DISTINCT FROM (CASE WHEN w.op_state = 'pending' THEN NULL ELSE w.body END)
"""
)

# One write alone (the usual case: writes seldom finish within one window of each other):
# the same guards and tail, with the operation found by equality on its key, which PostgreSQL
# plans as an index lookup at any table size, statistics or none.
COMPLETE_SQL = (
    LOCK_CALLS
    + """, op AS (
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
       AND (SELECT count(*) FROM locked) >= 0  -- the calls are locked before this row
    RETURNING operation_id
"""
    + FINISH_STARTED
    + OPERATION_TAIL
    + ", (SELECT count(*) FROM op) AS won"
)

COMPLETED_BY_SQL = """
SELECT 1 FROM callgate.operations
 WHERE operation_id = :operation_id AND generation = :generation AND state = :op_state
   AND result IS NOT DISTINCT FROM (CASE WHEN CAST(:op_state AS text) = 'pending' THEN NULL
                                         ELSE CAST(:body AS jsonb) END)
"""

_COMPLETE_MANY = db.Statement(COMPLETE_MANY_SQL)
_COMPLETE = db.Statement(COMPLETE_SQL)
_COMPLETED_BY = db.Statement(COMPLETED_BY_SQL)
_COMPLETED_MANY_BY = db.Statement(COMPLETED_MANY_BY_SQL)


@dataclass(frozen=True)
class Completion:
    """One write's outcome under its lease: the terminal status, the result body
    (``endings.result_body``) and the audit detail of its ``completed`` event."""

    lease: Lease
    status: str
    body: str
    detail: dict[str, Any]

    @property
    def key(self) -> str:
        """Unique among completions: one lease per operation and generation."""
        return f"{self.lease.operation_id}:{self.lease.generation}"

    @property
    def op_state(self) -> str:
        # A retryable failure ends the call but leaves the operation open for a later retry.
        return {"succeeded": "succeeded", "failed_terminal": "failed"}.get(self.status, "pending")


def completion(
    lease: Lease, status: str, payload: dict[str, Any], detail: dict[str, Any] | None = None
) -> Completion:
    """A ``Completion``, or ``UnstorableValue`` if the payload is not JSON (NaN, bytes, a
    set)."""
    assert status in TERMINAL_STATES
    try:
        body = result_body(status, payload)
    except (TypeError, ValueError) as exc:
        raise UnstorableValue(f"the result holds a value JSON cannot carry ({exc})") from None
    return Completion(lease, status, body, dict(detail or {}))


@dataclass(frozen=True)
class Completed:
    """What ``complete_many`` did: the calls each winning completion ended, by key (a
    completion absent from ``won`` was fenced out: its owner no longer holds the lease; a
    retry that found its own lost commit counts as won with 0 calls), and the calls the
    batch unblocked, to dispatch."""

    won: dict[str, int]
    successors: list[Any]

    def finished(self, c: Completion) -> int | None:
        """The calls ``c`` ended, or None when it was fenced out."""
        return self.won.get(c.key)


def document(batch: Sequence[Completion]) -> str:
    """The batch as ``COMPLETE_MANY_SQL``'s one JSON parameter. The bodies are JSON text
    already: joined as they are (an array of JSON texts would cost an escaping pass)."""
    return (
        "["
        + ",".join(
            f'{{"operation_id":{json.dumps(c.lease.operation_id)},'
            f'"owner_token":"{c.lease.owner_token}","generation":{int(c.lease.generation)},'
            f'"intent_hash":{json.dumps(c.lease.intent_hash)},"op_state":"{c.op_state}",'
            f'"status":"{c.status}","body":{c.body},"detail":{json.dumps(c.detail)}}}'
            for c in batch
        )
        + "]"
    )


def complete_many(
    engine: Engine, batch: Sequence[Completion], *, retry_seconds: float = db.TRANSIENT_SECONDS
) -> Completed:
    """Commit each completion whose owner still holds its generation, in one statement (see
    ``COMPLETE_MANY_SQL``); the others change nothing.

    Retried on a refused connect, a lost connection or a deadlock abort for up to
    ``retry_seconds`` (a worker gives it as long as a lease lasts: the results exist nowhere
    else). A value Postgres cannot store raises ``UnstorableValue`` and changes nothing."""
    if len(batch) == 1:
        return _complete_one(engine, batch[0], retry_seconds)
    params = {"completions": document(batch)}
    attempts = 0

    def attempt() -> Completed:
        nonlocal attempts
        attempts += 1
        with db.raw_autocommit(engine) as conn:
            row = conn.one(_COMPLETE_MANY, params)
            won = {key: int(row.ended.get(key.rsplit(":", 1)[0], 0)) for key in row.won}
            if attempts > 1 and len(won) < len(batch):
                for mine in conn.execute(_COMPLETED_MANY_BY, params):
                    won.setdefault(mine.key, 0)
        return Completed(won, list(row.successors))

    return storing(attempt, seconds=max(retry_seconds, db.TRANSIENT_SECONDS))


def _complete_one(engine: Engine, c: Completion, retry_seconds: float) -> Completed:
    params = {
        "operation_id": c.lease.operation_id,
        "owner_token": c.lease.owner_token,
        "generation": c.lease.generation,
        "intent_hash": c.lease.intent_hash,
        "op_state": c.op_state,
        "status": c.status,
        "body": c.body,
        "event": "completed",
        "detail": json.dumps(c.detail),
    }
    attempts = 0

    def attempt() -> Completed:
        nonlocal attempts
        attempts += 1
        with db.raw_autocommit(engine) as conn:
            row = conn.one(_COMPLETE, params)
            if row.won:
                return Completed({c.key: row.finished}, list(row.successors))
            # Did the attempt whose connection died commit first?
            if attempts > 1 and conn.first(_COMPLETED_BY, params) is not None:
                return Completed({c.key: 0}, [])
            return Completed({}, [])

    return storing(attempt, seconds=max(retry_seconds, db.TRANSIENT_SECONDS))


def complete(
    engine: Engine,
    lease: Lease,
    *,
    status: str,
    payload: dict[str, Any],
    detail: dict[str, Any] | None = None,
    retry_seconds: float = db.TRANSIENT_SECONDS,
) -> Finished:
    """Commit one outcome iff this owner still holds this generation; else change nothing
    (``won=False``). The worker gives it as long as its lease could last: until the lease
    runs out nobody can take the operation over, so any outage shorter than that ends with
    the owner's own result. A value Postgres cannot store raises ``UnstorableValue``."""
    one = completion(lease, status, payload, detail)
    done = complete_many(engine, [one], retry_seconds=retry_seconds)
    finished = done.finished(one)
    return Finished(finished or 0, done.successors, won=finished is not None)
