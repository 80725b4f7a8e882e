"""What a chaos run measured and which promises it broke, read from the database only.

Counts come from callgate's own rows (calls, outbox, trace events), the demo downstream's
(``downstream.requests``, ``side_effects``, ``rejections``) and the chaos registry's
(``chaos.invocations``), never from what a process said about itself.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, Engine, text

from callgate.ops.lab.chaos.scenario import Expect

TERMINAL = ("succeeded", "failed_retryable", "failed_terminal")
OPEN_STATES = ("proposed", "started", "awaiting_approval")

COUNT_SQL = {
    "calls": "SELECT count(*) FROM callgate.calls",
    "turns": "SELECT count(*) FROM callgate.turns",
    "writes": "SELECT count(*) FROM callgate.calls WHERE kind = 'write'",
    "side_effects": "SELECT count(*) FROM downstream.side_effects",
    "requests": "SELECT count(*) FROM downstream.requests",
    "invocations": "SELECT count(*) FROM chaos.invocations",
    # A read may run more than once for one call (it takes no reservation); a write never.
    "write_invocations": (
        "SELECT count(*) FROM chaos.invocations AS i WHERE i.operation_id IN"
        " (SELECT operation_id FROM callgate.calls WHERE kind = 'write')"
    ),
    "outage_refusals": "SELECT count(*) FROM chaos.invocations WHERE refused",
    "reservations": (
        "SELECT count(*) FROM callgate.trace_events WHERE event IN ('reserved', 'takeover')"
    ),
    "takeovers": "SELECT count(*) FROM callgate.trace_events WHERE event = 'takeover'",
    "fence_rejections": "SELECT count(*) FROM downstream.rejections WHERE reason = 'stale_fence'",
    "stale_completions": (
        "SELECT count(*) FROM callgate.trace_events WHERE event = 'stale_completion_rejected'"
    ),
    "duplicates": "SELECT count(*) FROM callgate.trace_events WHERE event = 'duplicate_delivery'",
    "approvals_granted": "SELECT count(*) FROM callgate.approvals WHERE state = 'approved'",
    "reconciliation_pending": (
        "SELECT count(*) FROM callgate.calls"
        " WHERE result #>> '{error,code}' = 'reconciliation_pending'"
    ),
    # After a PostgreSQL failover: the histories callgate reconciled, the writes it put in
    # doubt, the results it adopted from Redis, the turns the new history lacked.
    "failovers": "SELECT count(*) FROM callgate.histories WHERE epoch > 0",
    "doubted": "SELECT coalesce(sum(doubted), 0) FROM callgate.histories",
    "adopted": "SELECT coalesce(sum(adopted), 0) FROM callgate.histories",
    "lost_turns": "SELECT count(*) FROM callgate.lost_turns",
}

# Per (write operation, resource): how many times the downstream changed it.
TWICE_SQL = """
SELECT o.operation_id, s.resource_id, count(*) AS n
  FROM downstream.side_effects AS s
  JOIN callgate.operations AS o ON o.idempotency_key = s.idempotency_key
 GROUP BY o.operation_id, s.resource_id
HAVING count(*) > 1
"""

SUCCEEDED_WITHOUT_EFFECT_SQL = """
SELECT c.call_id
  FROM callgate.calls AS c
  JOIN callgate.operations AS o USING (operation_id)
 WHERE c.kind = 'write' AND c.state = 'succeeded'
   AND NOT EXISTS (SELECT 1 FROM downstream.side_effects AS s
                    WHERE s.idempotency_key = o.idempotency_key)
"""

RESULTS_PER_CALL_SQL = """
SELECT c.call_id, c.state, count(ob.id) AS n
  FROM callgate.calls AS c
  LEFT JOIN callgate.outbox AS ob ON ob.call_ref = c.id
 WHERE c.state IN ('succeeded', 'failed_retryable', 'failed_terminal')
 GROUP BY c.id, c.call_id, c.state
HAVING count(ob.id) <> 1
"""

OPEN_SQL = """
SELECT c.call_id, c.tool_name, c.state FROM callgate.calls AS c
 WHERE c.state NOT IN ('succeeded', 'failed_retryable', 'failed_terminal')
 ORDER BY c.call_id
"""

# Every reservation of one operation carried one intent; the downstream never saw one key
# used for two different requests.
INTENTS_SQL = """
SELECT operation_id, count(DISTINCT detail ->> 'intent_hash') AS n
  FROM callgate.trace_events
 WHERE event IN ('reserved', 'takeover') AND operation_id IS NOT NULL
 GROUP BY operation_id
HAVING count(DISTINCT detail ->> 'intent_hash') > 1
"""
KEY_CONFLICTS_SQL = (
    "SELECT count(*) FROM downstream.rejections WHERE reason = 'idempotency_conflict'"
)

OUTCOMES_SQL = """
SELECT tool_name, coalesce(result #>> '{error,code}', state) AS outcome, count(*) AS n
  FROM callgate.calls GROUP BY 1, 2 ORDER BY 1, 2
"""


def counts(engine: Engine) -> dict[str, int]:
    """Every count a scenario can bound, from the database."""
    with engine.connect() as conn:
        return {name: _scalar(conn, sql) for name, sql in COUNT_SQL.items()}


def outcomes(engine: Engine) -> dict[str, dict[str, int]]:
    """Per tool: how many calls ended with each outcome (a status or an error code)."""
    found: dict[str, dict[str, int]] = defaultdict(dict)
    with engine.connect() as conn:
        for row in conn.execute(text(OUTCOMES_SQL)):
            found[row.tool_name][row.outcome] = int(row.n)
    return dict(found)


def open_calls(engine: Engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [(r.call_id, r.tool_name, r.state) for r in conn.execute(text(OPEN_SQL))]


def terminal_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return _scalar(
            conn,
            "SELECT count(*) FROM callgate.calls"
            " WHERE state IN ('succeeded', 'failed_retryable', 'failed_terminal')",
        )


def unpublished(engine: Engine) -> int:
    """Results committed but not yet published to their turn's stream by a relayer."""
    with engine.connect() as conn:
        return _scalar(conn, "SELECT count(*) FROM callgate.outbox WHERE published_at IS NULL")


def recovery_seconds(engine: Engine, last_fault_at: Any) -> float | None:
    """From the last fault to the last call's completion or result's publication, on
    Postgres' clock (0 if all of it happened before; None while a call is still open or a
    result unpublished)."""
    if open_calls(engine) or unpublished(engine):
        return None
    with engine.connect() as conn:
        value = conn.execute(
            text(
                "SELECT extract(epoch FROM greatest("
                "   (SELECT max(completed_at) FROM callgate.calls),"
                "   (SELECT max(published_at) FROM callgate.outbox))"
                " - CAST(:t AS timestamptz))"
            ),
            {"t": last_fault_at},
        ).scalar()
    return max(0.0, float(value)) if value is not None else 0.0


def violations(engine: Engine) -> list[str]:
    """The promises every scenario keeps, whatever its faults; one line per broken one."""
    found: list[str] = []
    with engine.connect() as conn:
        for r in conn.execute(text(TWICE_SQL)):
            found.append(
                f"write operation {r.operation_id} changed {r.resource_id} downstream "
                f"{r.n} times (at most once)"
            )
        for r in conn.execute(text(SUCCEEDED_WITHOUT_EFFECT_SQL)):
            found.append(f"write {r.call_id} succeeded without a downstream side effect")
        for r in conn.execute(text(RESULTS_PER_CALL_SQL)):
            found.append(f"call {r.call_id} ({r.state}) has {r.n} terminal results (one)")
        for r in conn.execute(text(INTENTS_SQL)):
            found.append(f"operation {r.operation_id} was reserved under {r.n} intents (one)")
        conflicts = _scalar(conn, KEY_CONFLICTS_SQL)
        if conflicts:
            found.append(f"the downstream saw {conflicts} key(s) reused for another request")
    waiting = unpublished(engine)
    if waiting:
        found.append(f"{waiting} result(s) never published by a relayer")
    opened = open_calls(engine)
    if opened:
        shown = ", ".join(f"{c} {t} {s}" for c, t, s in opened[:5])
        more = f" and {len(opened) - 5} more" if len(opened) > 5 else ""
        found.append(f"{len(opened)} call(s) not terminal after the recovery window: {shown}{more}")
    return found


def expectations(
    expect: Expect, measured: dict[str, int], ended: dict[str, dict[str, int]]
) -> list[str]:
    """What this scenario expects on top: allowed outcomes per tool, bounds on counts."""
    found: list[str] = []
    for tool, seen in sorted(ended.items()):
        allowed = expect.outcomes.get(tool)
        if allowed is None:
            continue
        for outcome, n in sorted(seen.items()):
            if outcome not in allowed and outcome not in OPEN_STATES:  # open: a violation
                found.append(f"{n} {tool} call(s) ended {outcome}; expected {' or '.join(allowed)}")
    for metric, bound in expect.at_least.items():
        limit = measured[bound] if isinstance(bound, str) else bound
        if measured[metric] < limit:
            found.append(f"{metric} = {measured[metric]}, expected at least {bound} ({limit})")
    for metric, bound in expect.at_most.items():
        limit = measured[bound] if isinstance(bound, str) else bound
        if measured[metric] > limit:
            found.append(f"{metric} = {measured[metric]}, expected at most {bound} ({limit})")
    return found


def _scalar(conn: Connection, sql: str) -> int:
    return int(conn.execute(text(sql)).scalar() or 0)
