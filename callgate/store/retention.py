"""Retention: remove finished turns with their calls, outbox rows and trace events, and the
HTTP API's kept answers to ``Idempotency-Key`` repeats.

A turn goes only when every call of it is terminal and every outbox row of it is
published, so pruning never takes a result fan-in is still waiting for. An operation goes
with the last call that used it, unless it is awaiting a person's reconciliation (those stay
until settled). Removing a finished operation ends its idempotency: a write retried with the
same operation id after the retention window runs as a new write. Choose the window longer
than any retry your application makes (docs/operations.md, Retention, says so too).

Each batch is one statement over at most ``batch`` turns (oldest first, ``SKIP LOCKED``), so
pruning a large history holds no long locks and can run beside workers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from callgate.core.errors import InputError, ServiceUnavailable
from callgate.store import db

_T = TypeVar("_T")

_DUE = """
SELECT t.turn_id FROM callgate.turns AS t
 WHERE t.created_at < now() - make_interval(secs => :older_than)
   AND NOT EXISTS (SELECT 1 FROM callgate.calls AS c
                    WHERE c.turn_id = t.turn_id
                      AND c.state IN ('proposed', 'started', 'awaiting_approval'))
   AND NOT EXISTS (SELECT 1 FROM callgate.outbox AS o
                    WHERE o.turn_id = t.turn_id AND o.published_at IS NULL)
 ORDER BY t.created_at
 LIMIT :batch"""

PRUNE_SQL = f"""
WITH doomed AS ({_DUE}
   FOR UPDATE SKIP LOCKED
), gone_calls AS (
    DELETE FROM callgate.calls AS c USING doomed WHERE c.turn_id = doomed.turn_id
    RETURNING c.id, c.operation_id
), gone_outbox AS (
    DELETE FROM callgate.outbox AS o USING gone_calls WHERE o.call_ref = gone_calls.id
    RETURNING o.id
), doomed_operations AS (
    -- Operations no remaining call uses and nobody holds (finished, or still pending: a
    -- read's, which ends with no reservation, or one whose call was refused); never one
    -- awaiting reconciliation. A call that starts to use one concurrently makes this
    -- statement fail its foreign key check and roll back whole (prune then tries again).
    SELECT op.operation_id FROM callgate.operations AS op
     WHERE op.operation_id IN (SELECT operation_id FROM gone_calls)
       AND op.state IN ('pending', 'succeeded', 'failed')
       AND coalesce(op.result #>> '{{error,code}}', '') <> 'reconciliation_pending'
       AND NOT EXISTS (SELECT 1 FROM callgate.calls AS c
                        WHERE c.operation_id = op.operation_id
                          AND c.id NOT IN (SELECT id FROM gone_calls))
       FOR UPDATE
), gone_approvals AS (
    DELETE FROM callgate.approvals AS a USING doomed_operations AS d
     WHERE a.operation_id = d.operation_id
    RETURNING a.approval_id
), gone_operations AS (
    DELETE FROM callgate.operations AS op USING doomed_operations AS d
     WHERE op.operation_id = d.operation_id
    RETURNING op.operation_id
), gone_trace AS (
    DELETE FROM callgate.trace_events AS e
     WHERE e.turn_id IN (SELECT turn_id FROM doomed)
        OR (e.turn_id IS NULL AND e.operation_id IN (SELECT operation_id FROM gone_operations))
    RETURNING e.id
), gone_turns AS (
    DELETE FROM callgate.turns AS t USING doomed WHERE t.turn_id = doomed.turn_id
    RETURNING t.turn_id
)
SELECT (SELECT count(*) FROM gone_turns) AS turns,
       (SELECT count(*) FROM gone_calls) AS calls,
       (SELECT count(*) FROM gone_outbox) AS outbox,
       (SELECT count(*) FROM gone_trace) AS trace_events,
       (SELECT count(*) FROM gone_operations) AS operations,
       (SELECT count(*) FROM gone_approvals) AS approvals
"""

# Answers kept for the HTTP API's Idempotency-Key repeats, claimed before the window: a
# repeat after it records a new turn (like an operation removed above). Oldest first, in
# batches, skipping a claim another session holds.
PRUNE_API_IDEMPOTENCY_SQL = """
WITH doomed AS (
    SELECT key_id, idempotency_key FROM callgate.api_idempotency
     WHERE claimed_at < now() - make_interval(secs => :older_than)
     ORDER BY claimed_at
     LIMIT :batch
       FOR UPDATE SKIP LOCKED
)
DELETE FROM callgate.api_idempotency AS i USING doomed
 WHERE i.key_id = doomed.key_id AND i.idempotency_key = doomed.idempotency_key
"""

COUNT_API_IDEMPOTENCY_SQL = """
SELECT count(*) FROM callgate.api_idempotency
 WHERE claimed_at < now() - make_interval(secs => :older_than)
"""

COUNT_SQL = f"""
WITH due AS ({_DUE})
SELECT (SELECT count(*) FROM due) AS turns,
       (SELECT count(*) FROM callgate.calls AS c JOIN due USING (turn_id)) AS calls
"""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


@dataclass
class Pruned:
    """How many rows of each kind were removed (or, for a dry run, would be).

    ``unknown_batches``: batches sent again after a transient failure (a lost connection, a
    refused connect). One whose reply was lost removed its rows, but its counts never came
    back: the totals may then be short, never long."""

    turns: int = 0
    calls: int = 0
    outbox: int = 0
    trace_events: int = 0
    operations: int = 0
    approvals: int = 0
    api_idempotency: int = 0
    unknown_batches: int = 0

    def add(self, other: Pruned) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def parse_duration(value: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d`` or ``2w`` in seconds; anything else is refused."""
    match = _DURATION.match(value)
    if match is None or float(match.group(1)) <= 0:
        raise InputError(
            f"duration {value!r}: expected a positive number and a unit s, m, h, d or w "
            "(for example 7d)"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def prune(engine: Engine, *, older_than: float, batch: int = 500, dry_run: bool = False) -> Pruned:
    """Remove finished turns created more than ``older_than`` seconds ago, batch by batch,
    until none is left. ``dry_run`` counts the turns and calls that would go."""
    if not older_than > 0:
        raise InputError("older_than must be a positive number of seconds")
    params = {"older_than": older_than, "batch": batch}
    if dry_run:
        with db.autocommit(engine) as conn:
            row = conn.execute(text(COUNT_SQL), {**params, "batch": None}).one()
            answers = conn.execute(text(COUNT_API_IDEMPOTENCY_SQL), params).scalar_one()
        return Pruned(turns=row.turns, calls=row.calls, api_idempotency=answers)
    total = Pruned()
    conflicts = 0
    while True:
        try:
            row = _batch(engine, PRUNE_SQL, params, total, lambda r: r.one())
        except IntegrityError:
            # A new call started to use an operation of this batch: nothing was removed;
            # the next attempt sees that call and keeps its operation.
            conflicts += 1
            if conflicts > 3:
                raise
            continue
        done = Pruned(**row._asdict())
        total.add(done)
        if done.turns < batch:
            total.api_idempotency = _prune_api_idempotency(engine, older_than, batch, total)
            return total


def _prune_api_idempotency(engine: Engine, older_than: float, batch: int, total: Pruned) -> int:
    removed = 0
    params = {"older_than": older_than, "batch": batch}
    while True:
        gone = _batch(engine, PRUNE_API_IDEMPOTENCY_SQL, params, total, lambda r: int(r.rowcount))
        removed += gone
        if gone < batch:
            return removed


def _batch(
    engine: Engine,
    sql: str,
    params: dict[str, Any],
    total: Pruned,
    read: Callable[[Any], _T],
) -> _T:
    """One batch statement, sent again after a transient failure for up to the documented
    reconnect window (a restart, a refused connect). Safe to repeat: each batch selects
    again what is due, whole or not at all, so a repeat after a commit whose reply was
    lost removes the next batch, never a row twice or one it may not."""
    attempts = 0

    def attempt() -> _T:
        nonlocal attempts
        attempts += 1
        with db.autocommit(engine) as conn:
            return read(conn.execute(text(sql), params))

    try:
        return db.retry_transient(attempt)
    except Exception as exc:
        if not db.is_transient(exc):
            raise
        raise ServiceUnavailable(
            f"prune: cannot reach PostgreSQL ({type(exc).__name__}); batches may have been "
            "removed already (each is whole or nothing, and only what may go); run it "
            "again to finish"
        ) from exc
    finally:
        if attempts > 1:
            total.unknown_batches += 1
