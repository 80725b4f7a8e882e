"""Approval requests bound to an intent (the gate's risk and approval layers).

A call whose risk policy asks for approval is parked: no job, no reservation, no handler.
Its request carries the server-computed impact, the operation, the intent hash and the
policy version. An approver's decision applies to exactly that request:

- ``settle``: one statement that finds the request matching (operation, intent, policy
  version) or creates the next version of it, and parks the call when it is pending. A
  request for another intent of the same operation is superseded, and calls still parked
  on it end with ``idempotency_conflict`` (they asked for something else under this key).
- ``approve``: pending → approved, and every call parked on it back to ``proposed`` and
  marked dispatched; the caller enqueues them (if that is lost, the sweeper re-dispatches).
  The resumed call runs the whole gate again, so a changed argument or canonical resource
  computes another intent and the old approval does not apply (TOCTOU).
- ``deny``: pending → denied, and every call parked on it ends ``approval_denied``.

Each counts itself in ``callgate_approvals_total{tool, outcome}`` (requested, superseded,
granted, denied) in the process that ran it.

Four eyes and tenants: an approver acts for one tenant and never decides a request they
asked for themselves. Both conditions are in the guarded statement that decides, beside
``state = 'pending'``, so no interleaving can slip a self-approval between a check and a
write; when no row comes back, a read afterwards only explains why. Another tenant's request
is answered exactly like a missing one, so an approver learns nothing about other tenants.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from sqlalchemy import Connection, Engine, text

from callgate.core import logs
from callgate.core.errors import ApprovalError, ErrorCode, ServiceUnavailable
from callgate.observe import metrics
from callgate.store import db
from callgate.store.endings import CALL_RESULT, FINISH_TAIL, Finished, result_body
from callgate.tools import gate

log = logging.getLogger("callgate.approvals")

SETTLE_SQL = (
    f"""
WITH matching AS (
    SELECT approval_id, version, state
      FROM callgate.approvals
     WHERE operation_id = :operation_id AND intent_hash = :intent_hash
       AND policy_version = :policy_version AND state IN ('pending', 'approved', 'denied')
     ORDER BY version DESC
     LIMIT 1
       -- the newest committed state: a decision racing this statement is seen, not missed
       FOR SHARE
), superseded AS (
    UPDATE callgate.approvals
       SET state = 'superseded', decided_at = now()
     WHERE operation_id = :operation_id AND state IN ('pending', 'approved')
       AND NOT EXISTS (SELECT 1 FROM matching)
    RETURNING approval_id
), created AS (
    INSERT INTO callgate.approvals (approval_id, operation_id, version, tool_name, tenant_id,
                                    requested_by, intent_hash, policy_version, impact)
    SELECT CAST(:new_id AS uuid), :operation_id,
           coalesce((SELECT max(version) FROM callgate.approvals
                      WHERE operation_id = :operation_id), 0) + 1,
           :tool_name, :tenant_id, :requested_by, :intent_hash, :policy_version,
           CAST(:impact AS jsonb)
     WHERE NOT EXISTS (SELECT 1 FROM matching)
    ON CONFLICT (operation_id, version) DO NOTHING
    RETURNING approval_id, version, state
), target AS (
    SELECT approval_id, version, state FROM matching
    UNION ALL
    SELECT approval_id, version, state FROM created
), parked AS (
    UPDATE callgate.calls AS c
       SET state = 'awaiting_approval', approval_id = target.approval_id
      FROM target
     WHERE c.id = :call_ref AND c.state = 'proposed' AND target.state = 'pending'
    RETURNING c.id
), parked_trace AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, detail)
    SELECT CAST(:turn_id AS uuid), parked.id, :operation_id, 'approval_required',
           CAST(:detail AS jsonb)
           || jsonb_build_object('approval_id', target.approval_id, 'version', target.version)
      FROM parked, target
), finished AS (
    UPDATE callgate.calls AS c
       SET state = 'failed_terminal',
           result = {CALL_RESULT}
                    || CAST(:conflict_body AS jsonb),
           completed_at = now()
      FROM superseded
     WHERE c.approval_id = superseded.approval_id AND c.state = 'awaiting_approval'
       AND c.id <> :call_ref
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
    + """,
       (SELECT approval_id FROM target LIMIT 1) AS approval_id,
       (SELECT version FROM target LIMIT 1) AS version,
       (SELECT state FROM target LIMIT 1) AS state,
       (SELECT count(*) FROM parked) AS parked,
       (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM superseded) AS superseded"""
)

APPROVE_SQL = """
WITH decided AS (
    UPDATE callgate.approvals
       SET state = 'approved', decided_by = :by, decided_at = now()
     WHERE approval_id = :approval_id AND state = 'pending'
       AND tenant_id = :tenant AND requested_by = :requester
    RETURNING approval_id, version, operation_id
), resumed AS (
    UPDATE callgate.calls AS c
       SET state = 'proposed', dispatched_at = now(), dispatches = c.dispatches + 1
      FROM decided
     WHERE c.approval_id = decided.approval_id AND c.state = 'awaiting_approval'
    RETURNING c.id, c.turn_id, c.operation_id
), traced AS (
    INSERT INTO callgate.trace_events (turn_id, call_ref, operation_id, event, detail)
    SELECT resumed.turn_id, resumed.id, resumed.operation_id, 'approval_granted',
           jsonb_build_object('approval_id', decided.approval_id, 'version', decided.version,
                              'by', CAST(:by AS text))
      FROM resumed, decided
)
SELECT (SELECT count(*) FROM decided) AS decided,
       (SELECT coalesce(array_agg(id), '{}') FROM resumed) AS resumed
"""

DENY_SQL = (
    f"""
WITH decided AS (
    UPDATE callgate.approvals
       SET state = 'denied', decided_by = :by, decided_at = now()
     WHERE approval_id = :approval_id AND state = 'pending'
       AND tenant_id = :tenant AND requested_by = :requester
    RETURNING approval_id, version
), finished AS (
    UPDATE callgate.calls AS c
       SET state = 'failed_terminal',
           result = {CALL_RESULT}
                    || CAST(:body AS jsonb),
           completed_at = now()
      FROM decided
     WHERE c.approval_id = decided.approval_id AND c.state = 'awaiting_approval'
    RETURNING c.id, c.turn_id, c.operation_id, c.result, c.state AS status
)"""
    + FINISH_TAIL
    + ", (SELECT count(*) FROM decided) AS decided"
)

# After a transient failure the deciding statement is sent again; it matches no row when the
# attempt whose reply was lost had already decided. This tells that case (the request holds
# this approver's verdict) from a request someone else decided.
DECIDED_BY_SQL = """
SELECT 1 FROM callgate.approvals
 WHERE approval_id = :approval_id AND tenant_id = :tenant AND state = :verdict
   AND decided_by = :by
"""

# The calls a grant whose reply was lost put back to 'proposed': they may have no job yet (a
# duplicate job is harmless: the reservation runs a call once).
RESUMABLE_SQL = """
SELECT id FROM callgate.calls WHERE approval_id = :approval_id AND state = 'proposed'
 ORDER BY created_at
"""

# The calls a denial whose reply was lost ended (what the command reports).
DENIED_SQL = """
SELECT count(*) FROM callgate.calls
 WHERE approval_id = :approval_id AND state = 'failed_terminal'
   AND result #>> '{error,code}' = 'approval_denied'
"""

LIST_SQL = """
SELECT a.approval_id, a.version, a.state, a.tool_name, a.tenant_id, a.requested_by,
       a.operation_id, a.intent_hash, a.policy_version, a.impact, a.decided_by,
       a.created_at, a.decided_at,
       (SELECT coalesce(array_agg(c.call_id ORDER BY c.created_at), '{}')
          FROM callgate.calls AS c WHERE c.approval_id = a.approval_id) AS call_ids
  FROM callgate.approvals AS a
 WHERE a.tenant_id = :tenant
   AND (CAST(:state AS text) IS NULL OR a.state = :state)
   AND (CAST(:approval_id AS uuid) IS NULL OR a.approval_id = :approval_id)
 ORDER BY a.created_at
"""

Verdict = Literal["pending", "approved", "denied"]


@dataclass(frozen=True)
class Settled:
    """The request that now governs this intent, and whether this call was parked on it."""

    approval_id: uuid.UUID | None
    version: int
    state: Verdict | None  # None: lost a race creating it; settle again
    parked: bool
    finished: Finished


def settle(
    engine: Engine,
    *,
    operation_id: str,
    call_ref: uuid.UUID,
    turn_id: uuid.UUID,
    tool_name: str,
    tenant_id: str,
    requested_by: str,
    intent_hash: str,
    policy_version: str,
    impact: dict[str, Any],
    detail: dict[str, Any] | None = None,
) -> Settled:
    conflict = {
        "code": ErrorCode.IDEMPOTENCY_CONFLICT.value,
        "details": [
            {
                "code": "approval_superseded",
                "message": "this operation now awaits approval for a different intent",
            }
        ],
    }
    with db.autocommit(engine) as conn:
        row = conn.execute(
            text(SETTLE_SQL),
            {
                "operation_id": operation_id,
                "call_ref": call_ref,
                "turn_id": turn_id,
                "new_id": uuid.uuid4(),
                "tool_name": tool_name,
                "tenant_id": tenant_id,
                "requested_by": requested_by,
                "intent_hash": intent_hash,
                "policy_version": policy_version,
                "impact": json.dumps(impact),
                "conflict_body": result_body("failed_terminal", conflict),
                "event": "approval_superseded",
                "generation": None,
                "detail": json.dumps(detail or {}),
            },
        ).one()
    metrics.approval(tool_name, "requested", row.created)
    metrics.approval(tool_name, "superseded", row.superseded)
    return Settled(
        approval_id=row.approval_id,
        version=row.version or 0,
        state=row.state,
        parked=bool(row.parked),
        finished=Finished(row.finished, list(row.successors)),
    )


def approve(engine: Engine, approval_id: str, *, by: str, tenant: str) -> list[uuid.UUID]:
    """Grant a pending request of ``tenant`` as ``by``. Returns the calls to enqueue again.

    Refused with ``approval_forbidden`` when ``by`` asked for it, ``unknown_approval`` when
    it does not exist or belongs to another tenant, ``approval_not_pending`` when decided.
    """
    ident = _parse_id(approval_id)
    who, tenant = _approver(by), _tenant(tenant)
    params = {"approval_id": ident, "by": who, "tenant": tenant}
    row = _decide(engine, APPROVE_SQL, params, verdict="approved")
    if row is None:  # an attempt whose reply was lost granted it
        with db.autocommit(engine) as conn:
            resumed = list(conn.execute(text(RESUMABLE_SQL), params).scalars())
    elif not row.decided:
        _explain(engine, ident, by=who, tenant=tenant)
    else:
        resumed = list(row.resumed)
    metrics.approval(_decided(engine, ident, "approval_granted", by=who), "granted")
    return resumed


def deny(engine: Engine, approval_id: str, *, by: str, tenant: str) -> Finished:
    """Refuse a pending request of ``tenant`` as ``by``: every call parked on it ends
    ``approval_denied``. Refused like ``approve`` (the requester cannot deny it either)."""
    ident = _parse_id(approval_id)
    who, tenant = _approver(by), _tenant(tenant)
    body = result_body(
        "failed_terminal",
        {
            "code": ErrorCode.APPROVAL_DENIED.value,
            "details": [{"code": "denied", "message": "an approver denied this action"}],
        },
    )
    params = {
        "approval_id": ident,
        "by": who,
        "tenant": tenant,
        "body": body,
        "event": "approval_denied",
        "generation": None,
        "detail": json.dumps({"approval_id": str(ident), "by": who}),
    }
    row = _decide(engine, DENY_SQL, params, verdict="denied")
    if row is not None and not row.decided:
        _explain(engine, ident, by=who, tenant=tenant)
    metrics.approval(_decided(engine, ident, "approval_denied", by=who), "denied")
    if row is None:
        # A denial whose reply was lost ended its calls; their successors, if any, are
        # dispatched by the sweeper (it dispatches a successor whose predecessor has ended).
        with db.autocommit(engine) as conn:
            ended = conn.execute(text(DENIED_SQL), params).scalar_one()
        return Finished(ended, [])
    return Finished(row.finished, list(row.successors))


def _decide(engine: Engine, sql: str, params: dict[str, Any], *, verdict: Verdict) -> Any:
    """Send the deciding statement, again after a transient failure (a lost connection, a
    refused connect: it is guarded on ``pending``, so a repeat decides nothing twice).

    Returns its row, or None when a repeat found the request already holding this
    approver's ``verdict``: the attempt whose reply was lost decided it. If every attempt
    fails, the error says the decision may have been recorded (a lost reply cannot tell),
    never that nothing happened."""
    attempts = 0

    def attempt() -> Any:
        nonlocal attempts
        attempts += 1
        with db.autocommit(engine) as conn:
            requester = _four_eyes(conn, params)
            row = conn.execute(text(sql), {**params, "requester": requester}).one()
            if row.decided or attempts == 1:
                return row
            mine = conn.execute(text(DECIDED_BY_SQL), {**params, "verdict": verdict}).first()
            return None if mine is not None else row

    try:
        return db.retry_transient(attempt)
    except Exception as exc:
        if not db.is_transient(exc):
            raise
        ident = params["approval_id"]
        raise ServiceUnavailable(
            f"approvals: cannot reach PostgreSQL ({_first_line(exc)}); the decision may "
            f"have been recorded: `callgate approvals show {ident} --tenant {params['tenant']}` "
            "tells, and repeating the command is safe (it never decides twice)"
        ) from exc


def requests(
    engine: Engine, *, tenant: str, state: str | None = None, approval_id: str | None = None
) -> list[dict[str, Any]]:
    """The requests of ``tenant`` (only), oldest first, optionally of one state or id."""
    ident = _parse_id(approval_id) if approval_id else None
    with db.autocommit(engine) as conn:
        rows = conn.execute(
            text(LIST_SQL), {"tenant": _tenant(tenant), "state": state, "approval_id": ident}
        ).mappings()
        return [_jsonable(dict(r)) for r in rows]


def show(engine: Engine, approval_id: str, *, tenant: str) -> dict[str, Any]:
    """One request of ``tenant``; another tenant's is ``unknown_approval``, like a missing one."""
    found = requests(engine, tenant=tenant, approval_id=approval_id)
    if not found:
        raise _unknown(approval_id)
    return found[0]


# Every call ever parked on the request (a decision resumes or ends each of them).
_DECIDED_SQL = """
SELECT a.tool_name, a.operation_id, c.turn_id, c.call_id, c.id AS call_ref
  FROM callgate.approvals AS a
  LEFT JOIN callgate.calls AS c ON c.approval_id = a.approval_id
 WHERE a.approval_id = :a
 ORDER BY c.turn_id, c.call_id
"""


def _decided(engine: Engine, ident: uuid.UUID, event: str, *, by: str) -> str:
    """Log the decision just recorded (one INFO record: the request, its calls, tool and
    approver, never arguments) and return its tool: the label it is counted under (a
    registered tool's name: a request exists only for a call the gate admitted). Here, so
    the CLI, the API and a library caller each log it once."""
    with db.autocommit(engine) as conn:
        rows = conn.execute(text(_DECIDED_SQL), {"a": ident}).all()
    calls = [r for r in rows if r.call_ref is not None]
    # A request with several parked calls names them all in one record: comma-separated.
    logs.event(
        log,
        event,
        approval_id=ident,
        principal_id=by,
        tool=rows[0].tool_name,
        operation_id=rows[0].operation_id,
        turn_id=",".join(dict.fromkeys(str(r.turn_id) for r in calls)) or None,
        call_id=",".join(r.call_id for r in calls) or None,
        call_ref=",".join(str(r.call_ref) for r in calls) or None,
        count=len(calls),
    )
    return str(rows[0].tool_name)


def _four_eyes(conn: Connection, params: dict[str, Any]) -> str:
    """The request's requester, once the decider (``by``) is not that person
    (``approval_forbidden`` otherwise; ``unknown_approval`` for a missing request or another
    tenant's). The deciding statement is guarded on this very requester: the column never
    changes, so the check made here holds for the row it decides."""
    ident, tenant = params["approval_id"], params["tenant"]
    requester = conn.execute(
        text(
            "SELECT requested_by FROM callgate.approvals WHERE approval_id = :a AND tenant_id = :t"
        ),
        {"a": ident, "t": tenant},
    ).scalar_one_or_none()
    if requester is None:
        raise _unknown(str(ident))
    if gate.same_person(requester, params["by"]):
        raise _forbidden(ident, requester, tenant)
    return str(requester)


def _forbidden(ident: uuid.UUID, requester: str, tenant: str) -> ApprovalError:
    return ApprovalError(
        f"approval request {ident} was asked for by {requester}, who cannot decide it; "
        f"another approver of {tenant} must; nothing changed",
        code=ErrorCode.APPROVAL_FORBIDDEN,
    )


def _explain(engine: Engine, ident: uuid.UUID, *, by: str, tenant: str) -> NoReturn:
    """Say why the deciding statement matched no row. Only explains: nothing is decided here,
    so a request decided meanwhile is reported as it now is."""
    found = requests(engine, tenant=tenant, approval_id=str(ident))
    if not found:
        raise _unknown(str(ident))
    request = found[0]
    if request["state"] != "pending":
        raise ApprovalError(
            f"approval request {ident} is {request['state']}, not pending; nothing changed",
            code=ErrorCode.APPROVAL_NOT_PENDING,
        )
    raise _forbidden(ident, request["requested_by"], tenant)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unknown(approval_id: str) -> ApprovalError:
    # The same words for a missing request and another tenant's: no existence oracle.
    return ApprovalError(f"no approval request {approval_id}")


def _parse_id(approval_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(approval_id)
    except ValueError:
        raise ApprovalError(f"{approval_id!r} is not an approval id (expected a UUID)") from None


def _approver(by: str) -> str:
    if not by.strip():
        raise ApprovalError(
            "an approval needs the approver's name (--by USER)", code=ErrorCode.INVALID_INPUT
        )
    return by.strip()


def _tenant(tenant: str) -> str:
    if not tenant.strip():
        raise ApprovalError(
            "an approver acts for one tenant (--tenant TENANT)", code=ErrorCode.INVALID_INPUT
        )
    return tenant.strip()


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, uuid.UUID):
            value = str(value)
        elif hasattr(value, "isoformat"):
            value = value.isoformat(timespec="seconds")
        elif isinstance(value, list):
            value = [str(v) for v in value]
        out[key] = value
    return out
