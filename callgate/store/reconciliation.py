"""Writes a person must settle: the manual reconciliation queue.

A write ends ``reconciliation_pending`` when callgate cannot know whether it took effect (its
worker died after the request left, the downstream takes no idempotency key and offers no
status lookup, or the lookup could not tell). Running it again could apply it twice, so
callgate never does. Its calls have their terminal result already (``failed_terminal`` with
that code; fan-in is complete), and its operation is ``failed`` with the same body.

A person checks the downstream (by the operation's idempotency key and canonical resource)
and records what happened with ``resolve``: one guarded statement moves the operation from
"awaiting reconciliation" to ``succeeded`` or ``failed`` with a body naming who settled it,
and writes the audit event in the same transaction. The calls keep the one result they were
given; the settled outcome is what a later call reusing the operation id (a retry of the
same logical write in a new turn) receives, instead of ``reconciliation_pending`` again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, cast

from sqlalchemy import Engine, text

from callgate.core.errors import ErrorCode, InputError, ReconciliationError, ServiceUnavailable
from callgate.core.types import TRUST_LABEL
from callgate.store import db
from callgate.store.endings import result_body

Outcome = Literal["succeeded", "failed"]

_AWAITING = """
    op.state = 'failed' AND op.result #>> '{error,code}' = 'reconciliation_pending'"""

PENDING_SQL = """
SELECT op.operation_id, op.tenant_id, op.tool_name, op.idempotency_key, op.generation,
       op.canonical, op.completed_at,
       extract(epoch FROM now() - op.completed_at) AS age_seconds,
       (SELECT count(*) FROM callgate.calls AS c WHERE c.operation_id = op.operation_id)
         AS calls
  FROM callgate.operations AS op
 WHERE op.awaits_reconciliation  -- the _AWAITING rows, as the operations_reconciliation index
   AND (CAST(:tenant AS text) IS NULL OR op.tenant_id = :tenant)
   AND (CAST(:operation_id AS text) IS NULL OR op.operation_id = :operation_id)
 ORDER BY op.completed_at, op.operation_id
 LIMIT :limit
"""

# Guarded on the state it moves from: a second resolve (or two people at once) matches no
# row and changes nothing. The audit event commits with the outcome or not at all.
RESOLVE_SQL = f"""
WITH settled AS (
    UPDATE callgate.operations AS op
       SET state = :state, result = CAST(:body AS jsonb), completed_at = now()
     WHERE op.operation_id = :operation_id AND {_AWAITING}
    RETURNING op.operation_id, op.generation
), audited AS (
    INSERT INTO callgate.trace_events (operation_id, event, generation, detail)
    SELECT operation_id, 'reconciled', generation, CAST(:detail AS jsonb) FROM settled
)
SELECT operation_id, generation FROM settled
"""

# After a transient failure the resolve is sent again; it matches no row when the attempt
# whose reply was lost had already settled the operation. This tells that case (the
# operation holds this person's outcome, audited) from one someone else settled.
SETTLED_BY_SQL = """
SELECT op.generation FROM callgate.operations AS op
 WHERE op.operation_id = :operation_id AND op.state = :state
   AND EXISTS (SELECT 1 FROM callgate.trace_events AS t
                WHERE t.operation_id = op.operation_id AND t.event = 'reconciled'
                  AND t.detail ->> 'by' = :by AND t.detail ->> 'outcome' = :outcome)
"""

STATE_SQL = """
SELECT state, result #>> '{error,code}' AS code FROM callgate.operations
 WHERE operation_id = :operation_id
"""

TRACE_SQL = """
SELECT t.event, t.generation, t.detail, t.at, c.call_id, c.turn_id
  FROM callgate.trace_events AS t
  LEFT JOIN callgate.calls AS c ON c.id = t.call_ref
 WHERE t.operation_id = :operation_id
 ORDER BY t.at, t.id
"""

CALLS_SQL = """
SELECT c.turn_id, c.call_id, c.state, c.result #>> '{error,code}' AS code, c.completed_at
  FROM callgate.calls AS c WHERE c.operation_id = :operation_id ORDER BY c.created_at, c.id
"""


@dataclass(frozen=True)
class Resolved:
    operation_id: str
    outcome: Outcome
    by: str
    generation: int


def pending(engine: Engine, *, tenant: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Writes awaiting a person's decision, oldest first (of one tenant, if given)."""
    with db.autocommit(engine) as conn:
        rows = conn.execute(
            text(PENDING_SQL), {"tenant": tenant, "operation_id": None, "limit": limit}
        ).mappings()
        return [_json_ready(dict(r)) for r in rows]


def show(engine: Engine, operation_id: str) -> dict[str, Any]:
    """One write awaiting reconciliation, with its calls and its audit trace (never
    arguments or owner tokens)."""
    with db.autocommit(engine) as conn:
        found = (
            conn.execute(
                text(PENDING_SQL), {"tenant": None, "operation_id": operation_id, "limit": 1}
            )
            .mappings()
            .first()
        )
        if found is None:
            _explain(conn.execute(text(STATE_SQL), {"operation_id": operation_id}).first(),
                     operation_id)  # fmt: skip
        calls = conn.execute(text(CALLS_SQL), {"operation_id": operation_id}).mappings().all()
        trace = conn.execute(text(TRACE_SQL), {"operation_id": operation_id}).mappings().all()
    doc = _json_ready(dict(found or {}))
    doc["calls"] = [_json_ready(dict(c)) for c in calls]
    doc["trace"] = [_json_ready(dict(t)) for t in trace]
    return doc


def resolve(
    engine: Engine, operation_id: str, *, outcome: str, by: str, note: str = ""
) -> Resolved:
    """Record what a person found downstream: the write ``succeeded`` (it applied) or
    ``failed`` (it did not). Refused with ``not_awaiting_reconciliation`` for an operation
    that is not waiting for one (already settled, or never in doubt) and
    ``unknown_operation`` for one that does not exist."""
    if outcome not in ("succeeded", "failed"):
        raise InputError(f"outcome must be 'succeeded' or 'failed', not {outcome!r}")
    who = by.strip()
    if not who:
        raise InputError("--by must name the person who settles the write")
    settled: dict[str, Any] = {"reconciled": True, "outcome": outcome, "by": who}
    if note.strip():
        settled["note"] = note.strip()[:500]
    if outcome == "succeeded":
        body = result_body(
            "succeeded",
            {"source": {"reconciled_by": who}, "trust": TRUST_LABEL, "content": settled},
        )
        state = "succeeded"
    else:
        body = result_body(
            "failed_terminal",
            {
                "code": ErrorCode.EXECUTION_FAILED.value,
                "details": [
                    {"code": "reconciled", "message": f"{who} found that the write did not apply"}
                ],
            },
        )
        state = "failed"
    params = {
        "operation_id": operation_id,
        "state": state,
        "body": body,
        "detail": json.dumps(settled),
        "by": who,
        "outcome": outcome,
    }
    attempts = 0

    def attempt() -> Any:
        # Guarded on "awaiting reconciliation": sending it again after a transient failure
        # settles nothing twice; a repeat that matches no row asks whether the attempt whose
        # reply was lost settled it.
        nonlocal attempts
        attempts += 1
        with db.autocommit(engine) as conn:
            row = conn.execute(text(RESOLVE_SQL), params).first()
            if row is None and attempts > 1:
                row = conn.execute(text(SETTLED_BY_SQL), params).first()
            if row is None:
                _explain(conn.execute(text(STATE_SQL), {"operation_id": operation_id}).first(),
                         operation_id)  # fmt: skip
            return row

    try:
        row = db.retry_transient(attempt)
    except Exception as exc:
        if not db.is_transient(exc):
            raise
        text_ = str(getattr(exc, "orig", None) or exc).strip()
        raise ServiceUnavailable(
            f"reconcile: cannot reach PostgreSQL ({text_.splitlines()[0] if text_ else exc!r});"
            f" the outcome may have been recorded: `callgate reconcile show {operation_id}` "
            "tells (once settled it names the outcome), and repeating the command is safe "
            "(it never settles twice)"
        ) from exc
    return Resolved(operation_id, cast(Outcome, outcome), who, row.generation)


def _explain(row: Any, operation_id: str) -> NoReturn:
    """Say why no write awaiting reconciliation matched. Only explains; changes nothing."""
    if row is None:
        raise ReconciliationError(
            f"no operation {operation_id!r}", code=ErrorCode.UNKNOWN_OPERATION
        )
    raise ReconciliationError(
        f"operation {operation_id} is {row.state}"
        + (f" ({row.code})" if row.code else "")
        + ", not awaiting reconciliation; nothing changed",
        code=ErrorCode.NOT_AWAITING_RECONCILIATION,
    )


def _json_ready(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        elif key == "age_seconds" and value is not None:
            value = round(float(value), 1)
        elif not isinstance(value, str | int | float | bool | dict | list | type(None)):
            value = str(value)
        out[key] = value
    return out
