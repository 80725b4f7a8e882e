"""Reading the audit trace of a turn or a call. Owner tokens are never stored, so never shown."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, text

from callgate.core.errors import UnknownTurn

# With :tenant, only that tenant's turns; with :user too, only that user's (the API scopes a
# trace as it scopes results, unless the key may read its whole tenant's). Another's trace
# answers like a missing one.
TRACE_SQL = """
SELECT e.at, CAST(COALESCE(e.turn_id, c.turn_id) AS text) AS turn_id, c.call_id, c.tool_name,
       e.operation_id, e.event, e.generation, e.detail
  FROM callgate.trace_events AS e
  LEFT JOIN callgate.calls AS c ON c.id = e.call_ref
 WHERE (e.turn_id = :id OR e.call_ref = :id)
   AND (CAST(:tenant AS text) IS NULL
        OR EXISTS (SELECT 1 FROM callgate.turns AS t
                    WHERE t.turn_id = e.turn_id AND t.tenant_id = :tenant
                      AND (CAST(:user AS text) IS NULL OR t.user_id = :user)))
 ORDER BY e.at, e.id
"""

# A provider's call id (``call_42``) names a call within a turn; it may recur across turns,
# so each turn's events come together (turns in the order they began), never interleaved.
BY_CALL_ID_SQL = """
SELECT e.at, CAST(COALESCE(e.turn_id, c.turn_id) AS text) AS turn_id, c.call_id, c.tool_name,
       e.operation_id, e.event, e.generation, e.detail
  FROM callgate.calls AS c
  JOIN callgate.trace_events AS e ON e.call_ref = c.id
 WHERE c.call_id = :call_id
   AND (CAST(:tenant AS text) IS NULL
        OR EXISTS (SELECT 1 FROM callgate.turns AS t
                    WHERE t.turn_id = c.turn_id AND t.tenant_id = :tenant
                      AND (CAST(:user AS text) IS NULL OR t.user_id = :user)))
 ORDER BY min(e.at) OVER (PARTITION BY c.turn_id), c.turn_id, e.at, e.id
"""


def events(
    engine: Engine, turn_or_call: str, *, tenant: str | None = None, user: str | None = None
) -> list[dict[str, Any]]:
    """Events of a turn (its id), or of a call (its ref, or the provider's call id: of every
    turn that used it, each event naming its ``turn_id``, grouped by turn); with
    ``tenant``, only that tenant's, and with ``user`` too, only that user's turns' (another's
    answer like a missing one)."""
    params: dict[str, Any]
    scope = {"tenant": tenant, "user": user}
    try:
        query, params = TRACE_SQL, {"id": uuid.UUID(turn_or_call), **scope}
    except ValueError:
        query, params = BY_CALL_ID_SQL, {"call_id": turn_or_call, **scope}
    with engine.connect() as conn:
        rows = conn.execute(text(query), params).mappings().all()
    if not rows:
        raise UnknownTurn(f"no trace for {turn_or_call}")
    return [{**dict(r), "at": r["at"].isoformat(timespec="milliseconds")} for r in rows]


# The span contexts a call's earlier reservations recorded (when their worker traced): a
# takeover's span links to them. Read only by a traced takeover.
ATTEMPT_SPANS_SQL = """
SELECT detail -> 'span_context' AS span_context
  FROM callgate.trace_events
 WHERE call_ref = :call_ref AND event IN ('reserved', 'takeover')
   AND generation < :generation AND detail -> 'span_context' IS NOT NULL
 ORDER BY generation
"""


def attempt_spans(engine: Engine, call_ref: uuid.UUID, generation: int) -> list[dict[str, str]]:
    """The W3C contexts of the attempts at ``call_ref`` before ``generation``, first first."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(ATTEMPT_SPANS_SQL), {"call_ref": call_ref, "generation": generation}
        ).all()
    return [dict(row.span_context) for row in rows if isinstance(row.span_context, dict)]
