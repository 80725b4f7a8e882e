"""Reading the audit trace of a turn or a call. Owner tokens are never stored, so never shown."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, text

from store.errors import UnknownTurn

TRACE_SQL = """
SELECT e.at, c.call_id, c.tool_name, e.operation_id, e.event, e.generation, e.detail
  FROM callgate.trace_events AS e
  LEFT JOIN callgate.calls AS c ON c.id = e.call_ref
 WHERE e.turn_id = :id OR e.call_ref = :id
 ORDER BY e.at, e.id
"""


def events(engine: Engine, turn_or_call: str) -> list[dict[str, Any]]:
    try:
        ident = uuid.UUID(turn_or_call)
    except ValueError:
        raise UnknownTurn(f"{turn_or_call!r} is not a turn or call ref (expected a UUID)") from None
    with engine.connect() as conn:
        rows = conn.execute(text(TRACE_SQL), {"id": ident}).mappings().all()
    if not rows:
        raise UnknownTurn(f"no trace for {turn_or_call}")
    return [{**dict(r), "at": r["at"].isoformat(timespec="milliseconds")} for r in rows]
