"""How a call ends: its result, its outbox row, its audit, and the dispatch of what it
unblocked, in the statement that makes it terminal.

Every statement that ends calls (here and in ``reservations``, ``approvals``) builds the
result the same way (``call_result``) and shares the same tail (``finishing_tail``): a call
can never be terminal without its outbox row, and the relayer is woken in the same commit.

``END_READS_SQL`` ends reads, many at once, with no reservation: a read needs exactly one
terminal result, not an exclusive right to run. Its guard, ``state IN ('proposed',
'started')`` on the call row, is the only compare-and-set on a read's path: two deliveries of
one read may both run its handler, and only the first to commit ends the call (and writes
the one outbox row); the other's row matches nothing and changes nothing. Each row of the
batch is guarded on its own, the calls are locked in id order (as every statement that locks
several calls does), and the delivery's token stored in the audit lets a retry whose earlier
reply was lost recognise its own rows (``ENDED_BY_SQL``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DataError, OperationalError

from callgate.core.errors import UnstorableValue
from callgate.store import db

_T = TypeVar("_T")


def call_result(call_id: str, tool_name: str) -> str:
    """The head of a call's terminal result document: its ids, to which ``||`` joins the
    body (status, then data or error). Every statement that ends a call builds the result
    this way, so a result always names its call and tool, whichever path ended it."""
    return f"jsonb_build_object('call_id', {call_id}, 'tool_name', {tool_name})"


# ``call_result`` of the row being ended, in statements that update ``callgate.calls AS c``.
CALL_RESULT = call_result("c.call_id", "c.tool_name")

_OUTBOX = """
, outboxed AS (
    INSERT INTO callgate.outbox (turn_id, call_ref)
    SELECT turn_id, id FROM finished
    RETURNING id
)"""

_TRACED = """, traced AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, generation, detail)
    SELECT turn_id, id, operation_id, CAST(:event AS text), CAST(:generation AS integer),
           jsonb_build_object('status', status, 'code', result #>> '{error,code}')
             || CAST(:detail AS jsonb)
      FROM finished
)"""


def finishing_tail(next_calls: str, *, traced: bool = True) -> str:
    """The tail shared by every statement that ends calls: `finished` holds the calls just
    made terminal (id, turn_id, result, status). Their outbox rows, trace events (unless
    the statement stored its audit on the call row itself), the relayer's wake-up and the
    dispatch of the calls this unblocks (``next_calls``, a query of their ids) happen in the
    same statement."""
    return (
        _OUTBOX
        + (_TRACED if traced else "")
        + """, woken AS (
    SELECT pg_notify('callgate_outbox', '') FROM (SELECT 1 FROM outboxed LIMIT 1) AS any_row
), successors AS (
    UPDATE callgate.calls AS s
       SET dispatched_at = now(), dispatches = s.dispatches + 1
      FROM ("""
        + next_calls
        + """
           ) AS next
     WHERE s.id = next.id AND s.state = 'proposed'
    RETURNING s.id
)
SELECT (SELECT count(*) FROM finished) AS finished,
       (SELECT count(*) FROM woken) AS woken,
       (SELECT coalesce(array_agg(id), '{}') FROM successors) AS successors
"""
    )


# The next write of each finished call's turn.
NEXT_WRITE = """
SELECT n.id FROM finished JOIN callgate.calls AS n ON n.after_call = finished.id"""

# For statements that settle an operation's outcome, also the other calls waiting on it:
# each reuses the outcome, or gets idempotency_conflict, when it runs the gate.
WAITING_ON_OPERATION = """
UNION
SELECT n.id
  FROM finished
  JOIN callgate.calls AS n ON n.operation_id = finished.operation_id
  LEFT JOIN callgate.calls AS prev ON prev.id = n.after_call
 WHERE n.id NOT IN (SELECT id FROM finished)
   AND (prev.id IS NULL OR prev.state IN ('succeeded', 'failed_retryable', 'failed_terminal'))"""

FINISH_TAIL = finishing_tail(NEXT_WRITE)
OPERATION_TAIL = finishing_tail(NEXT_WRITE + WAITING_ON_OPERATION)

# Reads, ended with no reservation. The audit (the gate's verdicts, hashes, timings) is
# stored on the call row it describes: no trace_events row, and `callgate trace` shows it as
# the call's `completed` event. The calls are found by ``= ANY (ARRAY(…))``, an index
# condition: joined to the batch's rows, which the planner sizes at 100, a small calls table
# would be read whole, in the plan a prepared statement keeps while the table grows.
END_READS_SQL = (
    f"""
WITH ending AS (
    SELECT * FROM jsonb_to_recordset(CAST(:endings AS jsonb))
           AS e(id uuid, status text, body jsonb, audit jsonb)
), locked AS (
    SELECT c.id FROM callgate.calls AS c
     WHERE c.id = ANY (ARRAY(SELECT id FROM ending)) AND c.state IN ('proposed', 'started')
     ORDER BY c.id
       FOR UPDATE
), finished AS (
    UPDATE callgate.calls AS c
       SET state = ending.status,
           result = {CALL_RESULT}
                    || ending.body,
           audit = ending.audit,
           completed_at = now()
      FROM ending
     WHERE c.id = ANY (ARRAY(SELECT id FROM locked))
       AND c.id = ending.id
       AND c.state IN ('proposed', 'started')
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status,
              ending.audit ->> 'delivery' AS delivery
)"""
    + finishing_tail(NEXT_WRITE, traced=False)
    + ", (SELECT coalesce(array_agg(delivery), '{}') FROM finished) AS ended"
)

# Which of these calls an earlier attempt of this very statement ended (its reply lost).
ENDED_BY_SQL = """
SELECT audit ->> 'delivery' AS delivery FROM callgate.calls
 WHERE id = ANY(CAST(:refs AS uuid[])) AND audit ->> 'delivery' = ANY(CAST(:tokens AS text[]))
"""

_END_READS = db.Statement(END_READS_SQL)
_ENDED_BY = db.Statement(ENDED_BY_SQL)


@dataclass(frozen=True)
class Finished:
    finished: int
    successors: list[uuid.UUID]
    won: bool = True


@dataclass(frozen=True)
class Ending:
    """One read's outcome: its call, terminal status, body (``result_body``) and audit. The
    audit carries ``delivery``, a token of this delivery, by which a retry recognises it."""

    ref: uuid.UUID
    status: str
    body: str
    audit: dict[str, Any]


@dataclass(frozen=True)
class Ended:
    """What ``end_reads`` did: the endings that ended their call, by delivery token (the
    others found it ended already: another delivery's result stands; two endings of one
    call in one batch end it once), and the calls their endings unblocked, to dispatch."""

    tokens: set[str]
    successors: list[uuid.UUID]

    def ended(self, ending: Ending) -> bool:
        return ending.audit["delivery"] in self.tokens


def result_body(status: str, payload: dict[str, Any]) -> str:
    """``{"status", "data"}`` or ``{"status", "error"}``: a result without its call's ids."""
    key = "data" if status == "succeeded" else "error"
    return json.dumps({"status": status, key: payload}, allow_nan=False)


def ending(ref: uuid.UUID, status: str, payload: dict[str, Any], audit: dict[str, Any]) -> Ending:
    """An ``Ending``, or ``UnstorableValue`` if the payload is not JSON (NaN, bytes, a set)."""
    try:
        body = result_body(status, payload)
    except (TypeError, ValueError) as exc:
        raise UnstorableValue(f"the result holds a value JSON cannot carry ({exc})") from None
    return Ending(ref, status, body, {**audit, "delivery": uuid.uuid4().hex})


def end_reads(
    engine: Engine, endings: Sequence[Ending], *, retry_seconds: float = db.TRANSIENT_SECONDS
) -> Ended:
    """End each read whose call is still open, in one statement (see ``END_READS_SQL``).

    Retried on a refused connect, a lost connection or a deadlock abort for up to
    ``retry_seconds``; a retry counts as its own every row an earlier attempt ended. A value
    Postgres cannot store raises ``UnstorableValue`` and changes nothing (``end_each`` then
    finds which row it was)."""
    # One JSON document for the batch: the bodies are JSON text already, joined as they are
    # (an array parameter of JSON texts costs the client an escaping pass over every quote).
    params = {
        "endings": "["
        + ",".join(
            f'{{"id":"{e.ref}","status":{json.dumps(e.status)},'
            f'"body":{e.body},"audit":{json.dumps(e.audit)}}}'
            for e in endings
        )
        + "]"
    }
    refs = [e.ref for e in endings]
    tokens = [e.audit["delivery"] for e in endings]
    attempts = 0

    def attempt() -> Ended:
        nonlocal attempts
        attempts += 1
        with db.raw_autocommit(engine) as conn:
            row = conn.one(_END_READS, params)
            ended = set(row.ended)
            if attempts > 1 and len(ended) < len(endings):
                mine = conn.execute(_ENDED_BY, {"refs": refs, "tokens": tokens})
                ended |= {r.delivery for r in mine}
        return Ended(ended, list(row.successors))

    return storing(attempt, seconds=max(retry_seconds, db.TRANSIENT_SECONDS))


def storing(attempt: Callable[[], _T], *, seconds: float = db.TRANSIENT_SECONDS) -> _T:
    """Run a statement that stores a result: retried while the failure is transient; a
    value Postgres refuses to store (a NUL character, an invalid escape) is reported as
    ``UnstorableValue``, since no retry can ever commit it."""
    try:
        return db.retry_until(attempt, seconds=seconds)
    except (DataError, OperationalError) as exc:
        if isinstance(exc, OperationalError) and db.is_transient(exc):
            raise  # out of retries: the job fails, and the sweeper dispatches the call again
        reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else "DataError"
        raise UnstorableValue(f"PostgreSQL cannot store this result ({reason})") from exc
