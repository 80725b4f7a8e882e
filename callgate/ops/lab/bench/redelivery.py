"""The same operations delivered three times to four workers: what useful throughput is
left, and whether each write reached its downstream exactly once.

Reads from ``downstream.side_effects``, the demo downstream's own record of every resource it
changed; a count other than one for any operation fails the bench.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, text

from callgate.ops.lab.bench.procs import BenchError

EFFECTS_SQL = """
SELECT count(*) AS operations,
       count(*) FILTER (WHERE effects = 1) AS exactly_once,
       coalesce(sum(effects), 0) AS effects
  FROM (SELECT o.operation_id, count(s.id) AS effects
          FROM callgate.calls AS c
          JOIN callgate.operations AS o ON o.operation_id = c.operation_id
          LEFT JOIN downstream.side_effects AS s ON s.idempotency_key = o.idempotency_key
         WHERE c.turn_id = ANY(CAST(:turns AS uuid[]))
         GROUP BY o.operation_id) AS per_operation
"""


def check_effects(engine: Engine, turns: Sequence[str]) -> dict[str, int]:
    """One side effect per operation, or BenchError."""
    with engine.connect() as conn:
        row = conn.execute(text(EFFECTS_SQL), {"turns": list(turns)}).mappings().one()
    found = {k: int(v) for k, v in row.items()}
    if found["exactly_once"] != found["operations"] or found["operations"] == 0:
        raise BenchError(
            f"side effects: {found['operations'] - found['exactly_once']} of "
            f"{found['operations']} operations did not have exactly one ({found['effects']} "
            "in all)"
        )
    return found
