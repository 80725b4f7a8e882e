"""What the state gauges read from Postgres: open calls by state and age, the outbox's
backlog, operations awaiting reconciliation, pending approvals. One transaction with a
statement timeout, so a slow database costs a scrape at most that long."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Engine, text

# Two halves, each matching a partial index's predicate (calls_open, calls_awaiting), so
# terminal history is never read. A call is past its recovery window when it is proposed or
# started, older than the window, and not waiting behind a write of its turn that waits for
# a person (that wait is callgate_approvals_pending's business).
CALLS_SQL = """
WITH open_calls AS (
    SELECT state, created_at, turn_id, kind, position
      FROM callgate.calls WHERE is_open  -- state IN ('proposed', 'started')
    UNION ALL
    SELECT state, created_at, turn_id, kind, position
      FROM callgate.calls WHERE is_awaiting  -- state = 'awaiting_approval'
)
SELECT c.state,
       count(*) FILTER (WHERE c.created_at > now() - interval '1 minute') AS under_1m,
       count(*) FILTER (WHERE c.created_at <= now() - interval '1 minute'
                          AND c.created_at > now() - interval '5 minutes') AS "1m_to_5m",
       count(*) FILTER (WHERE c.created_at <= now() - interval '5 minutes'
                          AND c.created_at > now() - interval '15 minutes') AS "5m_to_15m",
       count(*) FILTER (WHERE c.created_at <= now() - interval '15 minutes'
                          AND c.created_at > now() - interval '1 hour') AS "15m_to_1h",
       count(*) FILTER (WHERE c.created_at <= now() - interval '1 hour') AS over_1h,
       extract(epoch FROM now() - min(c.created_at)) AS oldest,
       count(*) FILTER (
           WHERE c.state <> 'awaiting_approval'
             AND c.created_at < now() - make_interval(secs => :window)
             AND NOT (c.kind = 'write' AND EXISTS (
                     SELECT 1 FROM callgate.calls AS p
                      WHERE p.turn_id = c.turn_id AND p.is_awaiting
                        AND p.position < c.position))
       ) AS overdue
  FROM open_calls AS c
 GROUP BY c.state
"""

OUTBOX_SQL = """
SELECT (SELECT count(*) FROM callgate.outbox WHERE published_at IS NULL) AS unpublished,
       (SELECT extract(epoch FROM now() - created_at)
          FROM callgate.outbox WHERE published_at IS NULL
         ORDER BY id LIMIT 1) AS oldest
"""

# The predicate is exactly the partial index operations_reconciliation's, and
# store/reconciliation.py's "awaiting": a resolved operation leaves it.
RECONCILIATION_SQL = """
SELECT count(*) AS pending, extract(epoch FROM now() - min(completed_at)) AS oldest
  FROM callgate.operations
 WHERE awaits_reconciliation  -- state 'failed', error code reconciliation_pending
"""

APPROVALS_SQL = """
SELECT count(*) AS pending, extract(epoch FROM now() - min(created_at)) AS oldest
  FROM callgate.approvals
 WHERE state = 'pending'
"""

QUERIES: Final = (CALLS_SQL, OUTBOX_SQL, RECONCILIATION_SQL, APPROVALS_SQL)


@dataclass(frozen=True)
class State:
    by_state: dict[str, Any]  # open calls' rows by state (CALLS_SQL)
    outbox: Any
    reconciliation: Any
    approvals: Any


def read(engine: Engine, *, window_seconds: float, timeout_ms: int) -> State:
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL statement_timeout = {int(timeout_ms)}"))
        by_state = {r.state: r for r in conn.execute(text(CALLS_SQL), {"window": window_seconds})}
        return State(
            by_state,
            conn.execute(text(OUTBOX_SQL)).one(),
            conn.execute(text(RECONCILIATION_SQL)).one(),
            conn.execute(text(APPROVALS_SQL)).one(),
        )
