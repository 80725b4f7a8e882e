"""Which PostgreSQL history callgate's rows belong to, and the reconciliation of a new one.

A history is a server's system identifier and timeline (migration 0018). A failover to an
asynchronous replica starts a new timeline on a copy that may lack the primary's last
transactions: a reservation, a downstream write's completion, a result the relayer already
published, even a whole turn. Until a new history is reconciled, the statement triggers of
migration 0018 refuse every statement that records a call, ends one or moves an operation
(SQLSTATE ``CGH01``, which ``db`` reports as a transient ``ServiceUnavailable``); the
sweepers reconcile it (``callgate.daemons.failover``) in three steps:

1. ``begin``: record the history with the next epoch and put in doubt every write that may
   have been reserved on the lost one. A pending operation of an open write becomes
   ``in_progress`` under an owner nobody holds, its lease already expired: whoever runs it
   next takes it over, so a keyed write is sent again with its key (the downstream answers
   with the first response), a write with a status lookup is looked up, and any other write
   ends ``reconciliation_pending``, never run twice. An operation already in progress keeps
   its owner and lease, which decide as they always do.
2. ``adopt``: a call still open here whose result Redis already holds (published from the
   lost history) ends with exactly that result: one terminal result per call, whatever the
   promotion rewound.
3. ``finish``: mark the history reconciled; the triggers let statements through again.

Each step is safe to repeat and to run in several processes at once: ``begin`` serialises
on an advisory lock and resumes a history recorded but not reconciled, and ``adopt`` is
guarded on the call still being open. A fencing token is ``epoch << 32 | generation``
(``fencing_token``): a generation counted again from a smaller number on the new history
still gives tokens larger than any the lost history handed out.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine, text

from callgate.store import db
from callgate.store.endings import CALL_RESULT, NEXT_WRITE, WAITING_ON_OPERATION, finishing_tail

EPOCH_SQL = "SELECT callgate.history_epoch() AS epoch"

# Every reconciler serialises here, and on the last history row.
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext('callgate.histories'))"

LATEST_SQL = """
SELECT epoch, system_identifier, timeline, reconciled_at FROM callgate.histories
 ORDER BY epoch DESC LIMIT 1
   FOR UPDATE
"""

SERVER_SQL = """
SELECT system_identifier, callgate.server_timeline() AS timeline FROM pg_control_system()
"""

RECORD_SQL = """
INSERT INTO callgate.histories (epoch, system_identifier, timeline)
VALUES (:epoch, :system_identifier, :timeline)
"""

# A pending operation of an open write may have been reserved, sent and even completed on
# the lost history: taken over by whoever runs it next, as if its owner had died.
DOUBT_SQL = """
WITH doubted AS (
    UPDATE callgate.operations AS o
       SET state = 'in_progress',
           owner_token = gen_random_uuid(),
           lease_expires_at = now()
     WHERE o.state = 'pending'
       AND EXISTS (SELECT 1 FROM callgate.calls AS c
                    WHERE c.operation_id = o.operation_id
                      AND c.kind = 'write'
                      AND c.state IN ('proposed', 'started', 'awaiting_approval'))
    RETURNING 1
)
UPDATE callgate.histories SET doubted = (SELECT count(*) FROM doubted) WHERE epoch = :epoch
"""

OPEN_CALLS_SQL = """
SELECT id, turn_id, call_id FROM callgate.calls
 WHERE state IN ('proposed', 'started', 'awaiting_approval')
"""

# Each call ends with the result Redis holds for it, as it is; a write's operation settles
# with it (a retryable failure leaves it pending, as a completion does).
ADOPT_SQL = (
    """
WITH adopted AS (
    SELECT * FROM jsonb_to_recordset(CAST(:adopted AS jsonb)) AS a(id uuid, result jsonb)
), locked AS (
    SELECT c.id FROM callgate.calls AS c
     WHERE c.id IN (SELECT id FROM adopted)
       AND c.state IN ('proposed', 'started', 'awaiting_approval')
     ORDER BY c.id
       FOR UPDATE
), finished AS (
    UPDATE callgate.calls AS c
       SET state = a.result ->> 'status',
           result = """
    + CALL_RESULT
    + """ || (a.result - 'call_id' - 'tool_name'),
           completed_at = now()
      FROM adopted AS a
     WHERE c.id = a.id AND c.id IN (SELECT id FROM locked)
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status, c.kind
), settled AS (
    UPDATE callgate.operations AS o
       SET state = CASE f.status WHEN 'succeeded' THEN 'succeeded'
                                 WHEN 'failed_terminal' THEN 'failed'
                                 ELSE 'pending' END,
           result = CASE WHEN f.status = 'failed_retryable' THEN NULL
                         ELSE f.result - 'call_id' - 'tool_name' END,
           owner_token = NULL,
           lease_expires_at = NULL,
           completed_at = now()
      FROM finished AS f
     WHERE o.operation_id = f.operation_id
       AND f.kind = 'write'
       AND o.state IN ('pending', 'in_progress')
    RETURNING o.operation_id
), counted AS (
    -- Counted with the adoption itself: a reconciler that dies after this statement has
    -- adopted them, and the one that resumes finds nothing left to adopt.
    UPDATE callgate.histories SET adopted = adopted + (SELECT count(*) FROM finished)
     WHERE epoch = :epoch
)"""
    + finishing_tail(NEXT_WRITE + WAITING_ON_OPERATION)
)

# Turns Redis remembers that this history lacks: recorded as lost, and each write's operation
# id put in doubt (a submit again under it is taken over, never run as new).
LOST_SQL = """
WITH remembered AS (
    SELECT * FROM jsonb_to_recordset(CAST(:turns AS jsonb))
           AS r(turn_id uuid, tenant text, "user" text, at float8, writes jsonb)
), lost AS (
    INSERT INTO callgate.lost_turns (turn_id, epoch, submitted_at, operation_ids, tenant_id,
                                     user_id)
    SELECT r.turn_id, :epoch, to_timestamp(r.at),
           ARRAY(SELECT w ->> 0 FROM jsonb_array_elements(r.writes) AS w), r.tenant, r."user"
      FROM remembered AS r
     WHERE NOT EXISTS (SELECT 1 FROM callgate.turns AS t WHERE t.turn_id = r.turn_id)
    ON CONFLICT (turn_id) DO NOTHING
    RETURNING turn_id
), doubted AS (
    INSERT INTO callgate.operations (operation_id, tenant_id, tool_name, idempotency_key,
                                     state, owner_token, lease_expires_at)
    SELECT w ->> 0, r.tenant, w ->> 1, w ->> 2, 'in_progress', gen_random_uuid(), now()
      FROM remembered AS r
      JOIN lost ON lost.turn_id = r.turn_id
     CROSS JOIN LATERAL jsonb_array_elements(r.writes) AS w
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM lost) AS lost, (SELECT count(*) FROM doubted) AS doubted
"""

FINISH_SQL = """
UPDATE callgate.histories SET reconciled_at = now()
 WHERE epoch = :epoch AND reconciled_at IS NULL
"""

_EPOCH = db.Statement(EPOCH_SQL)


def fencing_token(epoch: int, generation: int) -> int:
    """The token a downstream sees: larger on a later history whatever the generation."""
    return (epoch << 32) | generation


def epoch(engine: Engine) -> int | None:
    """The epoch of the history the server is on, or None when it is not reconciled yet."""
    try:
        with db.raw_autocommit(engine) as conn:
            return int(conn.one(_EPOCH, {}).epoch)
    except Exception as exc:
        if db.is_history_changed(exc):
            return None
        raise


@dataclass(frozen=True)
class OpenCall:
    id: uuid.UUID
    turn_id: uuid.UUID
    call_id: str


@dataclass(frozen=True)
class Unreconciled:
    """A history recorded and its writes put in doubt, to be reconciled with Redis."""

    epoch: int
    doubted: int
    open_calls: list[OpenCall]


def begin(engine: Engine, *, reached: int | None = None) -> Unreconciled | None:
    """Record the server's history if it is new and put its writes in doubt; None when the
    last recorded history is the server's and is reconciled (nothing to do).

    ``reached`` is the highest epoch any reconciler is known to have reached elsewhere (the
    results fence in Redis). A second failover can promote a replica that never received
    the first one's reconciliation: numbering from its own rows would hand out that epoch
    again, and with it fencing tokens already used."""
    with db.translate_errors("reconcile PostgreSQL's history"), engine.begin() as conn:
        conn.execute(text("SET LOCAL callgate.reconciling = 'on'"))
        conn.execute(text(LOCK_SQL))
        latest = conn.execute(text(LATEST_SQL)).one_or_none()
        server = conn.execute(text(SERVER_SQL)).one()
        if latest is not None and (latest.system_identifier, latest.timeline) == (
            server.system_identifier,
            server.timeline,
        ):
            if latest.reconciled_at is not None:
                return None
            now = int(latest.epoch)  # recorded by a reconciler that did not finish: resume
        else:
            now = 0 if latest is None else int(latest.epoch) + 1
            if reached is not None:
                now = max(now, reached + 1)
            conn.execute(
                text(RECORD_SQL),
                {
                    "epoch": now,
                    "system_identifier": server.system_identifier,
                    "timeline": server.timeline,
                },
            )
            conn.execute(text(DOUBT_SQL), {"epoch": now})
        doubted = conn.execute(
            text("SELECT doubted FROM callgate.histories WHERE epoch = :epoch"), {"epoch": now}
        ).scalar_one()
        rows = conn.execute(text(OPEN_CALLS_SQL)).all()
    return Unreconciled(now, int(doubted), [OpenCall(r.id, r.turn_id, r.call_id) for r in rows])


@dataclass(frozen=True)
class Adopted:
    """How many calls ended with a published result, and the calls that unblocked."""

    ended: int
    successors: list[uuid.UUID]


def adopt(engine: Engine, epoch: int, results: Mapping[uuid.UUID, str]) -> Adopted:
    """End each open call in ``results`` (call ref → the result JSON Redis holds) with that
    result, counted on the history ``epoch``; the calls their endings unblocked are to be
    dispatched."""
    if not results:
        return Adopted(0, [])
    rows = [{"id": str(ref), "result": json.loads(result)} for ref, result in results.items()]
    params = {
        "adopted": json.dumps(rows),
        "epoch": epoch,
        "event": "adopted",
        "generation": None,
        "detail": json.dumps({"from": "a lost PostgreSQL history, as published"}),
    }
    with db.translate_errors("adopt published results"), engine.begin() as conn:
        conn.execute(text("SET LOCAL callgate.reconciling = 'on'"))
        row = conn.execute(text(ADOPT_SQL), params).one()
    return Adopted(int(row.finished), list(row.successors))


@dataclass(frozen=True)
class Remembered:
    """A turn Redis remembers being submitted, with its writes (operation id, tool, key)."""

    turn_id: uuid.UUID
    tenant_id: str
    at: float
    writes: tuple[tuple[str, str, str], ...]
    user_id: str | None = None  # None: remembered before the user was kept


def record_lost(engine: Engine, epoch: int, remembered: list[Remembered]) -> int:
    """Record as lost each remembered turn this history lacks, its writes in doubt; how many
    were lost."""
    if not remembered:
        return 0
    rows = [
        {
            "turn_id": str(t.turn_id),
            "tenant": t.tenant_id,
            "user": t.user_id,
            "at": t.at,
            "writes": t.writes,
        }
        for t in remembered
    ]
    with db.translate_errors("record lost turns"), engine.begin() as conn:
        conn.execute(text("SET LOCAL callgate.reconciling = 'on'"))
        row = conn.execute(text(LOST_SQL), {"turns": json.dumps(rows), "epoch": epoch}).one()
    return int(row.lost)


def finish(engine: Engine, epoch: int) -> None:
    """Mark the history reconciled (unless another reconciler already did)."""
    with db.translate_errors("reconcile PostgreSQL's history"), engine.begin() as conn:
        conn.execute(text("SET LOCAL callgate.reconciling = 'on'"))
        conn.execute(text(FINISH_SQL), {"epoch": epoch})


# The standbys the server streams to, as far as this role may see (a role without pg_monitor
# sees each standby but not its sync_state).
STANDBYS_SQL = """
SELECT count(*) FILTER (WHERE sync_state IN ('async', 'potential')) AS asynchronous,
       count(*) AS standbys
  FROM pg_stat_replication
"""


def replication_warning(engine: Engine) -> str | None:
    """A warning to log at start when the server streams to an asynchronous standby: a
    failover to it may lose the last transactions. None otherwise, or if it cannot be read."""
    try:
        with db.autocommit(engine) as conn:
            row = conn.execute(text(STANDBYS_SQL)).one()
    except Exception:  # a start-up remark, never a reason not to start
        return None
    if not row.asynchronous:
        return None
    return (
        f"PostgreSQL streams to {row.asynchronous} asynchronous standby(s): a failover to one "
        "may lose the last transactions. callgate reconciles such a failover before any work "
        "resumes, but a write it cannot prove ran ends reconciliation_pending; synchronous "
        "replication loses nothing (docs/operations.md, PostgreSQL failover)"
    )
