"""Raw protocol evidence of MCP calls, in the trace beside the calls they served.

An MCP ``tools/call`` goes out under a JSON-RPC request id callgate mints for it, never the
provider's call id. ``record`` writes one trace event for each call the operation has
started (normally one; a read's own open call), so ``callgate trace CALL_ID`` shows the
request id, the response id and what the server answered next to the provider's call id.
One statement; it changes no state.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, text

from callgate.store import db

RECORD_SQL = """
INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
SELECT c.turn_id, c.id, c.operation_id, :event, :generation,
       jsonb_build_object('tool_call_id', c.call_id) || CAST(:detail AS jsonb)
  FROM callgate.calls AS c
 WHERE c.operation_id = :operation_id
   -- the calls this run serves: those its reservation started; a read runs with no
   -- reservation (generation 0) for its call, which is still open
   AND (c.state = 'started' OR (CAST(:generation AS integer) = 0 AND c.state = 'proposed'))
RETURNING detail->>'tool_call_id'
"""


def record(
    engine: Engine, *, operation_id: str, generation: int, event: str, detail: dict[str, Any]
) -> list[str]:
    """Trace ``event`` beside each started call of the operation; returns their provider
    call ids."""
    with db.autocommit(engine) as conn:
        rows = conn.execute(
            text(RECORD_SQL),
            {
                "operation_id": operation_id,
                "generation": generation,
                "event": event,
                "detail": json.dumps(detail),
            },
        ).all()
    return [str(r[0]) for r in rows]
