"""Reading one call with everything a worker needs to decide, in one round trip."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from callgate.store import db

LOAD_SQL = """
SELECT c.id, c.turn_id, c.call_id, c.tool_name, c.arguments, c.kind, c.state,
       c.operation_id, c.after_call,
       prev.state AS after_state,
       t.request_id, t.tenant_id, t.user_id, t.roles,
       t.trace_context,  -- the submit span's W3C context: the parent of the worker's spans
       op.state AS op_state, op.intent_hash AS op_intent, op.canonical AS op_canonical,
       -- on Postgres' clock at both ends (no skew between hosts): the queue-wait histogram
       CAST(EXTRACT(EPOCH FROM clock_timestamp() - c.dispatched_at) AS float8)
         AS queue_wait_seconds,
       -- a read that ended under the same operation id (an application's retry in a later
       -- turn): its result is reused when the intent matches (a read stores no result on
       -- its operation; this is the one copy)
       prior.result AS prior_result, prior.audit ->> 'intent_hash' AS prior_intent
  FROM callgate.calls AS c
  JOIN callgate.turns AS t USING (turn_id)
  JOIN callgate.operations AS op ON op.operation_id = c.operation_id
  LEFT JOIN callgate.calls AS prev ON prev.id = c.after_call
  LEFT JOIN LATERAL (
      SELECT p.result, p.audit FROM callgate.calls AS p
       WHERE p.operation_id = c.operation_id AND p.id <> c.id AND p.audit IS NOT NULL
         AND p.state IN ('succeeded', 'failed_terminal')
       ORDER BY p.completed_at LIMIT 1
  ) AS prior ON true
 WHERE c.id = :ref
"""

# The calls one take returned, in one round trip.
LOAD_MANY_SQL = LOAD_SQL.replace("WHERE c.id = :ref", "WHERE c.id = ANY(CAST(:refs AS uuid[]))")

_LOAD = db.Statement(LOAD_SQL)
_LOAD_MANY = db.Statement(LOAD_MANY_SQL)


@dataclass(frozen=True)
class CallRecord:
    ref: uuid.UUID
    turn_id: uuid.UUID
    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    kind: str
    state: str
    operation_id: str
    after_call: uuid.UUID | None
    after_state: str | None
    request_id: str
    tenant_id: str
    user_id: str
    roles: tuple[str, ...]
    op_state: str
    op_intent: str | None
    op_canonical: dict[str, Any] | None
    # Seconds since the call's last dispatch when it was loaded (None: never dispatched).
    queue_wait_seconds: float | None = None
    # The submit's W3C trace context (``traceparent``, ``tracestate``); None: not traced.
    trace_context: dict[str, str] | None = None
    # The result of a read that ended under the same operation id, and its intent.
    prior_result: dict[str, Any] | None = None
    prior_intent: str | None = None


def load(engine: Engine, ref: uuid.UUID) -> CallRecord | None:
    with db.raw_autocommit(engine) as conn:
        row = conn.first(_LOAD, {"ref": ref})
    return None if row is None else _record(row)


def load_many(engine: Engine, refs: list[uuid.UUID]) -> dict[uuid.UUID, CallRecord]:
    """The calls among ``refs`` that exist, by ref."""
    with db.raw_autocommit(engine) as conn:
        rows = conn.execute(_LOAD_MANY, {"refs": refs})
    records = (_record(row) for row in rows)
    return {r.ref: r for r in records}


def _record(row: Any) -> CallRecord:
    data = row._asdict()
    data["ref"] = data.pop("id")
    data["roles"] = tuple(data["roles"])
    return CallRecord(**data)
