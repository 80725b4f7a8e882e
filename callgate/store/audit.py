"""Reading the audit trail of a turn or a call: the gate's verdicts, reservations, takeovers
and endings callgate recorded in PostgreSQL (``callgate.trace_events``, and a read's audit on
its call row), as ``callgate trace`` and the API's trace route show them. Not OpenTelemetry:
its spans are ``callgate.observe.tracing``'s. Owner tokens are never stored, so never shown."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, text

from callgate.core.errors import UnknownTurn

# A read ends without a trace_events row: its audit is stored on the call row
# (``calls.audit``), shown here as the call's ``completed`` event, ordered with the others.
_READ_AUDIT = """
SELECT c.completed_at AS at, CAST(c.turn_id AS text) AS turn_id, c.call_id, c.tool_name,
       c.operation_id, 'completed' AS event, CAST(NULL AS integer) AS generation,
       jsonb_build_object('status', c.state, 'code', c.result #>> '{error,code}')
         || (c.audit - 'delivery') AS detail,
       0 AS seq
  FROM callgate.calls AS c
 WHERE c.audit IS NOT NULL"""

_EVENT = """
SELECT e.at, CAST(COALESCE(e.turn_id, c.turn_id) AS text) AS turn_id, c.call_id, c.tool_name,
       e.operation_id, e.event, e.generation, e.detail, e.id AS seq"""

# With :tenant, only that tenant's turns; with :user too, only that user's (the API scopes a
# trace as it scopes results, unless the key may read its whole tenant's). Another's trace
# answers like a missing one.
_SCOPE = """
   AND (CAST(:tenant AS text) IS NULL
        OR EXISTS (SELECT 1 FROM callgate.turns AS t
                    WHERE t.turn_id = {turn} AND t.tenant_id = :tenant
                      AND (CAST(:user AS text) IS NULL OR t.user_id = :user)))"""

TRACE_SQL = (
    "SELECT at, turn_id, call_id, tool_name, operation_id, event, generation, detail FROM ("
    + _EVENT
    + """
  FROM callgate.trace_events AS e
  LEFT JOIN callgate.calls AS c ON c.id = e.call_ref
 WHERE (e.turn_id = :id OR e.call_ref = :id)"""
    + _SCOPE.format(turn="e.turn_id")
    + "\nUNION ALL"
    + _READ_AUDIT
    + "\n   AND (c.turn_id = :id OR c.id = :id)"
    + _SCOPE.format(turn="c.turn_id")
    + """
) AS trace
 ORDER BY at, seq
"""
)

# A provider's call id (``call_42``) names a call within a turn; it may recur across turns,
# so each turn's events come together (turns in the order they began), never interleaved.
BY_CALL_ID_SQL = (
    "SELECT at, turn_id, call_id, tool_name, operation_id, event, generation, detail FROM ("
    + _EVENT
    + """
  FROM callgate.calls AS c
  JOIN callgate.trace_events AS e ON e.call_ref = c.id
 WHERE c.call_id = :call_id"""
    + _SCOPE.format(turn="c.turn_id")
    + "\nUNION ALL"
    + _READ_AUDIT
    + "\n   AND c.call_id = :call_id"
    + _SCOPE.format(turn="c.turn_id")
    + """
) AS trace
 ORDER BY min(at) OVER (PARTITION BY turn_id), turn_id, at, seq
"""
)


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


# When each call's handler ran, on Postgres' clock: from its reservation (or takeover) to its
# completion event; a read, which takes no reservation, from its audit on the call row: its
# completion less the handler's measured duration. For the demo's and the tests' checks that
# calls ran at once.
INTERVALS_SQL = """
SELECT CAST(c.id AS text) AS ref, c.call_id,
       coalesce(min(e.at) FILTER (WHERE e.event IN ('reserved', 'takeover')),
                c.completed_at
                  - make_interval(secs => CAST(c.audit ->> 'duration_ms' AS float8) / 1000))
           AS started,
       coalesce(max(e.at) FILTER (WHERE e.event = 'completed'), c.completed_at) AS ended
  FROM callgate.calls AS c
  LEFT JOIN callgate.trace_events AS e ON e.call_ref = c.id
 WHERE c.turn_id = CAST(:turn AS uuid) OR c.id = ANY(CAST(:refs AS uuid[]))
 GROUP BY c.id
"""


def execution_intervals(
    engine: Engine, *, turn_id: str | None = None, refs: list[str] | None = None
) -> dict[str, tuple[str, Any, Any]]:
    """Per call (by ref) of a turn or among ``refs``: its call id, and when its handler
    started and its completion committed (None where the trace does not say)."""
    with engine.connect() as conn:
        rows = conn.execute(text(INTERVALS_SQL), {"turn": turn_id, "refs": refs or []}).all()
    return {r.ref: (r.call_id, r.started, r.ended) for r in rows}
