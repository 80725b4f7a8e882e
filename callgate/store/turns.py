"""Recording a turn (the producer's one transaction) and reading it back for fan-in."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Float, cast, extract, func, insert, select, text

from callgate.core import values
from callgate.core.errors import ErrorCode, InputError, TurnLost, UnknownTurn
from callgate.core.types import CallContext, ProposedCall, Turn, TurnCall
from callgate.core.values import printable
from callgate.store import db
from callgate.store.endings import call_result
from callgate.store.schema import calls, lost_turns, turns


@dataclass(frozen=True)
class PlannedCall:
    """A proposal with what the producer decided for it: ids, kind, key and predecessor."""

    ref: uuid.UUID
    proposal: ProposedCall
    kind: str
    operation_id: str
    idempotency_key: str
    after: uuid.UUID | None
    args_hash: str = ""
    # Set when the call is refused as it is recorded (budget, repeated call): its terminal
    # error body. It is never enqueued.
    refusal: dict[str, Any] | None = field(default=None)

    @property
    def dispatch_now(self) -> bool:
        return self.after is None and self.refusal is None


@dataclass(frozen=True)
class ConversationFacts:
    """What the conversation already holds, read under its lock."""

    prior_calls: int
    failed: frozenset[tuple[str, str]]  # (tool_name, args_hash) of calls that failed terminally
    # (tool_name, args_hash) → (call_id, operation_id) of a write that succeeded or has not
    # ended yet: the same write proposed again would apply twice.
    writes: Mapping[tuple[str, str], tuple[str, str]] = field(default_factory=dict)


Decide = Callable[[ConversationFacts], Sequence[PlannedCall]]

# A conversation id is the application's, so it is scoped by tenant. Calls that were only
# refused by these same rules never ran, so they do not make a later call a repeat.
CONVERSATION_SQL = """
SELECT count(*) AS prior_calls,
       coalesce(array_agg(c.tool_name || ':' || c.args_hash)
                FILTER (WHERE c.state = 'failed_terminal'
                          AND c.result #>> '{error,code}'
                              NOT IN ('budget_exceeded', 'repeated_call')), '{}') AS failed,
       coalesce(jsonb_object_agg(c.tool_name || ':' || c.args_hash,
                                 jsonb_build_array(c.call_id, c.operation_id))
                FILTER (WHERE c.kind = 'write'
                          AND c.state IN ('proposed', 'started', 'awaiting_approval',
                                          'succeeded')), '{}') AS writes
  FROM callgate.calls AS c
  JOIN callgate.turns AS t USING (turn_id)
 WHERE t.conversation_id = :conversation_id AND t.tenant_id = :tenant_id
"""

# Calls refused as they are recorded get their outbox row and trace event at once.
REFUSED_SQL = """
WITH refused AS (
    SELECT id, turn_id, operation_id, result, state AS status
      FROM callgate.calls
     WHERE turn_id = :turn_id AND state = 'failed_terminal'
), outboxed AS (
    INSERT INTO callgate.outbox (turn_id, call_ref)
    SELECT turn_id, id FROM refused
    RETURNING id
), traced AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, detail)
    SELECT turn_id, id, operation_id, 'refused_at_submit',
           jsonb_build_object('status', status, 'code', result #>> '{error,code}')
      FROM refused
)
SELECT pg_notify('callgate_outbox', '') FROM (SELECT 1 FROM outboxed LIMIT 1) AS any_row
"""


@dataclass
class RecordProgress:
    """What the attempts of one submit have done so far, for the error it may end with.

    ``commit_sent``: some attempt got as far as sending COMMIT. If it then lost its
    connection, that transaction may have committed; a connection lost before COMMIT rolls
    the transaction back, so a submit whose attempts all failed earlier recorded nothing."""

    commit_sent: bool = False


@dataclass(frozen=True)
class Recorded:
    """A submit's turn: the one this attempt recorded, or the one its key already names."""

    turn_id: uuid.UUID
    planned: list[PlannedCall]
    # True when the key already named a committed turn with the same request (a repeat).
    repeat: bool = False
    # A repeat's calls: (call_id, tool_name, operation_id, ref), proposal order.
    calls: list[tuple[str, str, str, uuid.UUID]] = field(default_factory=list)
    # A repeat's calls still waiting for their first job: enqueued again (a copy is
    # harmless; the reservation runs each call once).
    undispatched: list[uuid.UUID] = field(default_factory=list)

    def as_turn(self) -> Turn:
        if not self.repeat:
            return as_turn(self.turn_id, self.planned)
        return Turn(
            turn_id=str(self.turn_id),
            calls=tuple(
                TurnCall(call_id=c, tool_name=t, operation_id=op, ref=str(ref))
                for c, t, op, ref in self.calls
            ),
        )

    @property
    def dispatch(self) -> list[uuid.UUID]:
        if self.repeat:
            return list(self.undispatched)
        return [p.ref for p in self.planned if p.dispatch_now]


# The guard of an idempotent submit, as the transaction's first write: a second submit under
# the same key and tenant inserts nothing. A concurrent one waits here on the first one's
# uncommitted index entry until that commits (then inserts nothing) or rolls back (then
# inserts): no read-then-write race.
CLAIM_TURN_SQL = """
INSERT INTO callgate.turns (turn_id, request_id, tenant_id, user_id, roles, conversation_id,
                            submit_key, submit_hash, trace_context)
VALUES (:turn_id, :request_id, :tenant_id, :user_id, :roles, :conversation_id,
        :submit_key, :submit_hash, CAST(:trace_context AS jsonb))
ON CONFLICT (tenant_id, submit_key) DO NOTHING
RETURNING turn_id
"""

# The turn a key already names (committed: ON CONFLICT waited for it), and its calls.
KEYED_TURN_SQL = """
SELECT turn_id, submit_hash FROM callgate.turns
 WHERE tenant_id = :tenant_id AND submit_key = :submit_key
"""
KEYED_CALLS_SQL = """
SELECT id, call_id, tool_name, operation_id,
       (state = 'proposed' AND after_call IS NULL) AS undispatched
  FROM callgate.calls WHERE turn_id = :turn_id ORDER BY position
"""

# The turn's calls. A call the gate refused at submit is recorded already ended, with its
# result; the others wait for a worker (``:dispatch``: enqueued now, not held for a write).
# A turn's calls in one statement, whatever their number: one row each from one JSON
# document (the arguments as given, the refusal decided at submit if any).
INSERT_CALLS_SQL = f"""
INSERT INTO callgate.calls (id, turn_id, call_id, position, tool_name, arguments, kind,
                            operation_id, after_call, args_hash, state, result,
                            completed_at, dispatches, dispatched_at)
SELECT p.id, CAST(:turn AS uuid), p.call_id, p.position, p.tool, p.arguments, p.kind, p.op,
       p.after, p.args_hash,
       CASE WHEN p.refused THEN 'failed_terminal' ELSE 'proposed' END,
       CASE WHEN p.refused
            THEN {call_result("p.call_id", "p.tool")} || p.result END,
       CASE WHEN p.refused THEN now() END,
       p.dispatches, CASE WHEN p.dispatch THEN now() END
  FROM jsonb_to_recordset(CAST(:calls AS jsonb))
       AS p(id uuid, call_id text, position integer, tool text, arguments jsonb, kind text,
            op text, after uuid, args_hash text, refused boolean, result jsonb,
            dispatches integer, dispatch boolean)
 ORDER BY p.position
"""

# Each call's operation, in one statement; one an application handed in again (a retry of
# one logical write in a new turn) is reused, not re-issued.
INSERT_OPERATIONS_SQL = """
INSERT INTO callgate.operations (operation_id, tenant_id, tool_name, idempotency_key)
SELECT o.op, :tenant, o.tool, o.key
  FROM jsonb_to_recordset(CAST(:operations AS jsonb)) AS o(op text, tool text, key text)
    ON CONFLICT (operation_id) DO NOTHING
"""


def record(
    engine: Engine,
    context: CallContext,
    planned: Sequence[PlannedCall],
    decide: Decide | None = None,
    *,
    turn_id: uuid.UUID | None = None,
    trace_context: Mapping[str, str] | None = None,
) -> tuple[uuid.UUID, list[PlannedCall]]:
    """``record_turn`` without a submit key (a turn no repeat can find): its id and calls."""
    done = record_turn(
        engine, context, planned, decide, turn_id=turn_id, trace_context=trace_context
    )
    return done.turn_id, done.planned


def record_turn(
    engine: Engine,
    context: CallContext,
    planned: Sequence[PlannedCall],
    decide: Decide | None = None,
    *,
    turn_id: uuid.UUID | None = None,
    submit_key: str | None = None,
    submit_hash: str | None = None,
    progress: RecordProgress | None = None,
    trace_context: Mapping[str, str] | None = None,
) -> Recorded:
    """Turn, operations and calls in one transaction: all of it is recorded, or none.

    ``trace_context`` (the submit span's W3C ``traceparent``/``tracestate``) is stored with
    the turn, in the same INSERT: the worker's spans continue that trace.

    ``decide`` sees the conversation's facts under a per-conversation lock, so concurrent
    turns of one conversation cannot both spend its last budget, and returns the calls as
    they are to be recorded (some refused).

    With ``submit_key``, the turn is first claimed under the key (``CLAIM_TURN_SQL``): if
    the key already names a turn, nothing is written and that turn is returned when it was
    submitted with the same ``submit_hash``; another hash is ``idempotency_conflict``.
    """
    turn_id = turn_id or uuid.uuid4()
    progress = progress or RecordProgress()
    with engine.connect() as conn, conn.begin() as transaction:
        done = _record_in(
            conn, context, planned, decide, turn_id, submit_key, submit_hash, trace_context
        )
        # A lost connection from here on may have lost only COMMIT's reply.
        progress.commit_sent = True
        transaction.commit()
    return done


def _record_in(
    conn: Connection,
    context: CallContext,
    planned: Sequence[PlannedCall],
    decide: Decide | None,
    turn_id: uuid.UUID,
    submit_key: str | None,
    submit_hash: str | None,
    trace_context: Mapping[str, str] | None = None,
) -> Recorded:
    if submit_key is not None:
        claimed = conn.execute(
            text(CLAIM_TURN_SQL),
            {
                "turn_id": turn_id,
                "request_id": context.request_id,
                "tenant_id": context.tenant_id,
                "user_id": context.user_id,
                "roles": list(context.roles),
                "conversation_id": context.conversation_id,
                "submit_key": submit_key,
                "submit_hash": submit_hash,
                "trace_context": None if trace_context is None else json.dumps(trace_context),
            },
        ).first()
        if claimed is None:
            return _keyed_turn(conn, context, submit_key, submit_hash)
    facts = ConversationFacts(0, frozenset())
    if context.conversation_id is not None:
        conn.execute(
            text(
                "SELECT pg_advisory_xact_lock("
                "hashtext('callgate.conversation:' || :t || ':' || :c))"
            ),
            {"t": context.tenant_id, "c": context.conversation_id},
        )
        row = conn.execute(
            text(CONVERSATION_SQL),
            {"conversation_id": context.conversation_id, "tenant_id": context.tenant_id},
        ).one()
        facts = ConversationFacts(
            row.prior_calls,
            frozenset(_tool_and_hash(f) for f in row.failed),
            {_tool_and_hash(k): (v[0], v[1]) for k, v in row.writes.items()},
        )
    if decide is not None:
        planned = list(decide(facts))
    if submit_key is None:
        conn.execute(
            insert(turns).values(
                turn_id=turn_id,
                request_id=context.request_id,
                tenant_id=context.tenant_id,
                user_id=context.user_id,
                roles=list(context.roles),
                conversation_id=context.conversation_id,
                trace_context=None if trace_context is None else dict(trace_context),
            )
        )
    conn.execute(
        text(INSERT_OPERATIONS_SQL),
        {
            "tenant": context.tenant_id,
            "operations": json.dumps(
                [
                    {"op": p.operation_id, "tool": p.proposal.tool_name, "key": p.idempotency_key}
                    for p in planned
                ]
            ),
        },
    )
    _check_operations_belong(conn, context, planned)
    conn.execute(
        text(INSERT_CALLS_SQL),
        {
            "turn": turn_id,
            "calls": json.dumps(
                [
                    {
                        "id": str(p.ref),
                        "call_id": p.proposal.call_id,
                        "position": i,
                        "tool": p.proposal.tool_name,
                        "arguments": _arguments_document(p.proposal.arguments),
                        "kind": p.kind,
                        "op": p.operation_id,
                        "after": None if p.after is None else str(p.after),
                        "args_hash": p.args_hash,
                        "refused": p.refusal is not None,
                        "result": (
                            {"status": "failed_terminal", "error": p.refusal} if p.refusal else None
                        ),
                        "dispatches": 1 if p.dispatch_now else 0,
                        "dispatch": p.dispatch_now,
                    }
                    for i, p in enumerate(planned)
                ]
            ),
        },
    )
    if any(p.refusal is not None for p in planned):
        conn.execute(text(REFUSED_SQL), {"turn_id": turn_id})
    return Recorded(turn_id=turn_id, planned=list(planned))


def _keyed_turn(
    conn: Connection, context: CallContext, submit_key: str, submit_hash: str | None
) -> Recorded:
    found = conn.execute(
        text(KEYED_TURN_SQL), {"tenant_id": context.tenant_id, "submit_key": submit_key}
    ).one()
    if found.submit_hash != submit_hash:
        raise InputError(
            f"submit key {printable(submit_key)!r} already names turn {found.turn_id}, "
            "submitted with other proposals (or for another user or conversation); "
            "use a new key for a new request",
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
        )
    rows = conn.execute(text(KEYED_CALLS_SQL), {"turn_id": found.turn_id}).all()
    return Recorded(
        turn_id=found.turn_id,
        planned=[],
        repeat=True,
        calls=[(r.call_id, r.tool_name, r.operation_id, r.id) for r in rows],
        undispatched=[r.id for r in rows if r.undispatched],
    )


def _check_operations_belong(
    conn: Connection, context: CallContext, planned: Sequence[PlannedCall]
) -> None:
    """A reused operation id must be this tenant's, for this tool: otherwise its result (or
    its approval) would be shared across tenants or tools."""
    owners = conn.execute(
        text(
            "SELECT operation_id, tenant_id, tool_name FROM callgate.operations"
            " WHERE operation_id = ANY(:ops)"
        ),
        {"ops": [p.operation_id for p in planned]},
    ).all()
    owner = {r.operation_id: (r.tenant_id, r.tool_name) for r in owners}
    for p in planned:
        if owner.get(p.operation_id) != (context.tenant_id, p.proposal.tool_name):
            raise InputError(
                f"operation id {p.operation_id!r} was issued for another tenant or tool; "
                "issue a new operation id for this call"
            )


def _arguments_document(arguments: Mapping[str, Any] | str) -> Any:
    # Raw JSON strings are kept as given, so the gate can report invalid_arguments_json.
    if isinstance(arguments, str):
        return {values.RAW_ARGUMENTS: arguments}
    return dict(arguments)


def as_turn(turn_id: uuid.UUID, planned: Sequence[PlannedCall]) -> Turn:
    return Turn(
        turn_id=str(turn_id),
        calls=tuple(
            TurnCall(
                call_id=p.proposal.call_id,
                tool_name=p.proposal.tool_name,
                operation_id=p.operation_id,
                ref=str(p.ref),
            )
            for p in planned
        ),
    )


@dataclass(frozen=True)
class TurnState:
    turn_id: uuid.UUID
    proposals: list[tuple[str, str]]  # (call_id, tool_name) in proposal order
    results: list[dict[str, Any]]  # terminal results already committed
    # Seconds since the turn was submitted, on Postgres' clock, when it was read (fan-in
    # latency; None for a turn without calls).
    age_seconds: float | None = None


def _lost(turn_id: str, operation_ids: list[str]) -> TurnLost:
    writes = (
        f"; its writes may have applied: operation ids {', '.join(operation_ids)} stay in "
        "doubt (submitted again under one of them, a keyed write is sent again with its key, "
        "any other ends reconciliation_pending for a person to check)"
        if operation_ids
        else "; it held no write"
    )
    return TurnLost(
        f"turn {turn_id} was lost when PostgreSQL failed over to a replica that lacked it{writes}",
        details=[{"code": "lost_operations", "operation_ids": operation_ids}],
    )


def load_state(engine: Engine, turn_id: str) -> TurnState:
    """The turn's proposal set and whatever results Postgres already holds."""
    try:
        tid = uuid.UUID(turn_id)
    except ValueError:
        raise UnknownTurn(f"{turn_id!r} is not a turn id (expected a UUID)") from None
    with db.autocommit(engine) as conn:
        rows = conn.execute(
            select(
                calls.c.call_id,
                calls.c.tool_name,
                calls.c.result,
                cast(extract("epoch", func.clock_timestamp() - calls.c.created_at), Float).label(
                    "age_seconds"
                ),
            )
            .where(calls.c.turn_id == tid)
            .order_by(calls.c.position)
        ).all()
        if not rows:
            exists = conn.execute(select(turns.c.turn_id).where(turns.c.turn_id == tid)).first()
            if exists is None:
                lost = conn.execute(
                    select(lost_turns.c.operation_ids).where(lost_turns.c.turn_id == tid)
                ).first()
                if lost is not None:
                    raise _lost(turn_id, list(lost.operation_ids))
                raise UnknownTurn(f"no turn {turn_id}")
    return TurnState(
        turn_id=tid,
        proposals=[(r.call_id, r.tool_name) for r in rows],
        results=[r.result for r in rows if r.result is not None],
        age_seconds=float(rows[0].age_seconds) if rows else None,
    )


def awaiting_approval(engine: Engine, turn_id: uuid.UUID) -> dict[str, str]:
    """The turn's calls parked for an approval: call id → approval id."""
    with db.autocommit(engine) as conn:
        rows = conn.execute(
            select(calls.c.call_id, calls.c.approval_id).where(
                calls.c.turn_id == turn_id, calls.c.state == "awaiting_approval"
            )
        ).all()
    return {r.call_id: str(r.approval_id) for r in rows}


def _tool_and_hash(joined: str) -> tuple[str, str]:
    tool, _, args_hash = joined.rpartition(":")  # the hash is hex: the last ':' splits
    return tool, args_hash


def owner(engine: Engine, turn_id: str) -> tuple[str, str] | None:
    """(tenant, user) a turn was submitted for, a lost one's included (its owner is answered
    ``turn_lost``); None for a turn that does not exist, or a lost one whose owner was not
    kept."""
    try:
        tid = uuid.UUID(turn_id)
    except ValueError:
        return None
    with db.autocommit(engine) as conn:
        row = conn.execute(
            select(turns.c.tenant_id, turns.c.user_id).where(turns.c.turn_id == tid)
        ).first()
        if row is None:
            row = conn.execute(
                select(lost_turns.c.tenant_id, lost_turns.c.user_id).where(
                    lost_turns.c.turn_id == tid,
                    lost_turns.c.tenant_id.is_not(None),
                    lost_turns.c.user_id.is_not(None),
                )
            ).first()
    return None if row is None else (row.tenant_id, row.user_id)


def calls_of_approval(engine: Engine, approval_id: str) -> list[dict[str, Any]]:
    """The calls parked on (or resumed from) one approval request: id, state and result."""
    try:
        ident = uuid.UUID(approval_id)
    except ValueError:
        return []
    with db.autocommit(engine) as conn:
        rows = conn.execute(
            select(calls.c.call_id, calls.c.tool_name, calls.c.state, calls.c.result)
            .where(calls.c.approval_id == ident)
            .order_by(calls.c.created_at)
        ).mappings()
        return [dict(r) for r in rows]
