"""One delivery of one call: the gate, the approval, the reservation, the handler, completion.

Gate order: allowlist → parse → schema → business → authorization → risk →
approval bound to the intent → operation register (intent hash) → reservation → handler
with the idempotency key and the fence → completion. Every refusal commits the call's
terminal result without a reservation, so no handler runs after it.

Every path ends in exactly one of: the call's terminal result committed (by this delivery or
an earlier one), the call parked for an approval, or a counted trace event that changes
nothing (duplicate delivery, stale owner, waiting for the previous write). Nothing here
trusts RQ to deliver once.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from callgate.core import values
from callgate.core.errors import (
    CallgateError,
    ErrorCode,
    ServiceUnavailable,
    StaleFence,
    ToolError,
    UnstorableValue,
)
from callgate.core.settings import Settings
from callgate.core.types import TERMINAL_STATES
from callgate.observe import metrics, tracing
from callgate.queue import transport
from callgate.store import approvals, calls, completions, db, endings, reservations
from callgate.store.audit import attempt_spans
from callgate.tools import gate, redaction, results
from callgate.tools.intent import idempotency_key, intent_hash
from callgate.tools.registry import Arguments, ExecutionContext, Facts, Principal, Tool
from callgate.worker import events, group_commit, retry
from callgate.worker.events import DeliveryOutcome
from callgate.worker.heartbeat import Heartbeat
from callgate.worker.runtime import Runtime

log = logging.getLogger("callgate.worker")

SETTLE_ATTEMPTS = 3


class _Delivery:
    """One delivery's call record, audit detail and trace helper."""

    def __init__(
        self,
        rt: Runtime,
        call: calls.CallRecord,
        batch: group_commit.GroupCommit,
        ticket: group_commit.Ticket,
    ) -> None:
        self.rt = rt
        self.call = call
        self.loaded = time.monotonic()  # the gate-latency histogram starts here
        self.tool = metrics.tool_label(call.tool_name, rt.registry.tools)  # a bounded label
        self.verdicts: dict[str, str] = {}
        # The trace's fields. Never the owner token, the arguments or the raw result.
        self.audit: dict[str, Any] = {
            "request_id": call.request_id,
            "tool_call_id": call.call_id,
            "tool": call.tool_name,
            "verdicts": self.verdicts,
        }
        self.spans = tracing.NOT_TRACED
        # Calls finishing together end in one statement each kind; this delivery's place.
        self.batch = batch
        self.ticket = ticket
        # The call's status and error code once this delivery ended it (for its span).
        self.status: str | None = None
        self.code: str | None = None

    def trace(self, event: str, **detail: Any) -> None:
        reservations.trace(
            self.rt.engine,
            event=event,
            turn_id=self.call.turn_id,
            call_ref=self.call.ref,
            operation_id=self.call.operation_id,
            generation=detail.pop("generation", None),
            detail=redaction.redact_value(detail, names=False),
        )


def execute(
    rt: Runtime,
    ref: uuid.UUID,
    loaded: calls.CallRecord | None = None,
    ticket: group_commit.Ticket | None = None,
) -> DeliveryOutcome:
    """Run one delivery of call ``ref`` (``loaded``: its record, read with the others of its
    take; ``ticket``: its place among the reads that may end with it, taken when it was
    taken off the queue). Returns what happened, for logs and tests."""
    batch = group_commit.for_engine(rt.engine)
    ticket = ticket or batch.enter()
    try:
        call = loaded or db.retry_transient(lambda: calls.load(rt.engine, ref))
    except BaseException:
        batch.leave(ticket)
        raise
    if call is None:
        batch.leave(ticket)
        log.warning("job for unknown call %s dropped", ref)
        return DeliveryOutcome.UNKNOWN_CALL
    d = _Delivery(rt, call, batch, ticket)
    metrics.queue_waited(call.queue_wait_seconds)
    with tracing.delivering(
        tool_name=call.tool_name,
        call_id=call.call_id,
        turn_id=call.turn_id,
        operation_id=call.operation_id,
        call_ref=call.ref,
        trace_context=call.trace_context,
        queue_wait_seconds=call.queue_wait_seconds,
        # Opt-in: redacted by tracing before any of it is recorded.
        arguments=(
            call.arguments.get(values.RAW_ARGUMENTS, call.arguments)
            if rt.settings.trace_arguments == "redacted"
            else None
        ),
    ) as d.spans:
        try:
            outcome = _execute(d)
        finally:
            d.batch.leave(d.ticket)
        d.spans.finish(outcome.value, d.status, d.code, d.verdicts)
        return outcome


def _execute(d: _Delivery) -> DeliveryOutcome:
    call = d.call
    try:
        return events.delivered(call, d.tool, _deliver(d))
    except _LeaseLetGo as let_go:
        log.warning(
            "call %s: the downstream stayed unreachable (%s); its lease is let go, and the "
            "call is taken over and sent again with the same key",
            call.call_id,
            let_go.cause,
        )
        with contextlib.suppress(Exception):  # PostgreSQL may be what is unreachable
            d.trace("lease_let_go", reason=type(let_go.cause).__name__)
        return DeliveryOutcome.LEASE_LET_GO
    except (ServiceUnavailable, UnstorableValue):
        raise
    except Exception as exc:
        if db.is_transient(exc):
            raise  # Postgres is down or restarting: the sweeper dispatches the call again
        # A bug on the gate's own path (the handler's failures are handled in _run): no
        # handler ran for this delivery. End the call now rather than fail the job and let
        # the sweeper re-dispatch it into the same bug until it runs out of dispatches.
        log.exception("delivery of call %s failed", call.call_id)
        err = ToolError("callgate could not process this call", code=ErrorCode.EXECUTION_FAILED)
        return _reject(d, err)


def _deliver(d: _Delivery) -> DeliveryOutcome:
    call = d.call
    if call.state in TERMINAL_STATES or call.state == "awaiting_approval":
        # A parked call has no job: approving puts it back to 'proposed' before enqueueing.
        d.trace("duplicate_delivery", state=call.state)
        return DeliveryOutcome.DUPLICATE_DELIVERY
    if call.after_call is not None and call.after_state not in TERMINAL_STATES:
        # The previous write's completion dispatches this one; running now would reorder.
        d.trace("waiting_for_previous_write")
        return DeliveryOutcome.WAITING

    # Layers 1–3 depend on the call alone: a refusal ends just this call.
    try:
        tool, args = _check_call(d)
    except ToolError as err:
        return _reject(d, err)
    d.audit["schema_version"] = tool.schema_version

    principal = Principal(call.tenant_id, call.user_id, call.roles)
    key = idempotency_key(call.tenant_id, tool.name, call.operation_id)
    d.audit["operation_key_hash"] = key[:16]

    def intent_of(canonical: Mapping[str, Any]) -> str:
        return intent_hash(
            arguments=_plain(args),
            tenant_id=call.tenant_id,
            user_id=call.user_id,
            tool_name=tool.name,
            tool_version=tool.version,
            schema_version=tool.schema_version,
            resource=canonical,
            scope=d.rt.registry.scope_of(tool.name, call.roles),
        )

    if call.op_intent is not None and call.op_canonical is not None:
        admitted = intent_of(call.op_canonical)
        if admitted == call.op_intent:
            # This exact intent was admitted before, against the canonical resource stored
            # with it: every layer (the approval included) passed when it was reserved, or it
            # was refused. Its layers are not judged again on today's state, which after a
            # crash gap already holds the operation's own effect (the refund made the balance
            # smaller; a newer payment may have arrived). Reuse the outcome, or take over.
            d.audit["intent_hash"] = admitted
            facts = Facts(canonical=call.op_canonical)
            if call.op_state in ("succeeded", "failed"):
                d.verdicts["idempotency"] = "reused"
                return _reuse(d, admitted)
            d.verdicts["idempotency"] = "admitted_before"
            return _run(d, tool, args, key, admitted, facts)

    try:
        facts = _resolve(tool, args, principal, d.rt.settings)
    except ToolError as err:
        d.verdicts["business"] = err.code.value
        return _reject(d, err)
    intent = intent_of(facts.canonical)
    d.audit["intent_hash"] = intent

    # Layers 4–6 read server state: a refusal is the operation's outcome for this intent.
    try:
        impact = gate.judge(tool, args, facts, principal, d.verdicts)
    except ToolError as err:
        return _refuse(d, intent, err, facts.canonical)

    if impact is not None:
        parked = _settle_approval(d, tool, intent, impact, facts)
        if parked is not None:
            return parked

    if tool.kind == "read" and call.op_state == "pending" and call.op_intent is None:
        if call.prior_result is not None and call.prior_intent == intent:
            # A read that ended under this operation id with this intent (the same request
            # proposed again in a later turn): its result, not a new run.
            d.verdicts["idempotency"] = "reused"
            return _reuse_read(d, call.prior_result)
        return _run_read(d, tool, args, key, facts)
    return _run(d, tool, args, key, intent, facts)


def _check_call(d: _Delivery) -> tuple[Tool, Arguments]:
    return gate.admit_call(
        d.rt.registry, d.call.tool_name, d.call.arguments, d.call.roles, d.verdicts
    )


def _resolve(tool: Tool, args: Arguments, principal: Principal, settings: Settings) -> Facts:
    """The status lookup behind the intent and the business and authorization layers, with
    a dropped connection retried within the call's budget."""
    try:
        return gate.resolve_facts(tool, args, principal, lambda read: retry.lookup(read, settings))
    except ToolError as err:
        if err.__cause__ is not None and not isinstance(err.__cause__, ToolError):
            log.warning("status lookup for %s failed: %s", tool.name, err.__cause__)
        raise


def _settle_approval(
    d: _Delivery, tool: Tool, intent: str, impact: dict[str, Any], facts: Facts
) -> DeliveryOutcome | None:
    """Steps 6–7. ``None`` when an approval for exactly this intent is granted."""
    call = d.call
    for _ in range(SETTLE_ATTEMPTS):
        settled = approvals.settle(
            d.rt.engine,
            operation_id=call.operation_id,
            call_ref=call.ref,
            turn_id=call.turn_id,
            tool_name=tool.name,
            tenant_id=call.tenant_id,
            requested_by=call.user_id,
            intent_hash=intent,
            policy_version=tool.policy_version,
            impact=impact,
            detail=d.audit,
        )
        _finish(d.rt, settled.finished)
        if settled.state is not None:
            break
    else:  # another delivery kept winning the race to create the request; it parked the call
        d.trace("duplicate_delivery", reason="approval_request_race")
        return DeliveryOutcome.DUPLICATE_DELIVERY
    d.audit["approval"] = {"approval_id": str(settled.approval_id), "version": settled.version}
    if settled.state == "pending":
        d.verdicts["approval"] = "pending"
        if settled.parked:  # one record per state change: only the delivery that parked it
            events.parked(call, tool.name, settled.approval_id)
        return (
            DeliveryOutcome.AWAITING_APPROVAL
            if settled.parked
            else DeliveryOutcome.DUPLICATE_DELIVERY
        )
    if settled.state == "denied":
        d.verdicts["approval"] = ErrorCode.APPROVAL_DENIED.value
        denied = ToolError("an approver denied this action", code=ErrorCode.APPROVAL_DENIED)
        return _refuse(d, intent, denied, facts.canonical)
    d.verdicts["approval"] = "granted"
    return None


def _run(
    d: _Delivery, tool: Tool, args: Arguments, key: str, intent: str, facts: Facts
) -> DeliveryOutcome:
    rt, call = d.rt, d.call
    owner = uuid.uuid4()
    sent = time.monotonic()
    d.spans.stage(tracing.RESERVATION)
    reserved = reservations.reserve(
        rt.engine,
        operation_id=call.operation_id,
        call_ref=call.ref,
        turn_id=call.turn_id,
        owner_token=owner,
        intent_hash=intent,
        canonical=facts.canonical,
        lease_seconds=rt.settings.lease_seconds,
        detail=d.spans.stamped(d.audit),
    )
    if isinstance(reserved, reservations.NotReserved):
        return _lost(d, reserved, intent)
    if reserved.takeover and d.spans.on:  # one read, only for a traced takeover
        d.spans.link(attempt_spans(rt.engine, call.ref, reserved.generation))

    lease = reservations.Lease(call.operation_id, owner, reserved.generation, intent)
    events.reserved(call, d.tool, reserved.generation, reserved.takeover, d.loaded)
    d.spans.reserved(reserved.generation, reserved.takeover)
    d.spans.stage(tracing.HANDLER)
    started = time.monotonic()
    detail = dict(d.audit)
    with Heartbeat(
        rt.engine,
        lease,
        rt.settings.lease_seconds,
        reserved_at=sent,
        max_seconds=rt.settings.job_timeout_seconds,
    ) as heartbeat:
        ctx = ExecutionContext(
            tenant_id=call.tenant_id,
            user_id=call.user_id,
            operation_id=call.operation_id,
            idempotency_key=key,
            fencing_token=reserved.fencing_token,
            request_id=call.request_id,
            canonical=facts.canonical,
            lease_lost=heartbeat.expired,
            on_effect=metrics.effect_reporter(tool.name, tool.kind),
        )
        outcome: _Outcome | None = None
        age = reserved.key_age_seconds
        if reserved.takeover and not retry.safe_to_repeat(tool, age):
            # The previous owner died or stalled after it started: its write may have
            # applied. Fencing cannot tell (it refuses a stale owner's late write, not a
            # second write after the first one landed); only the tool's status lookup can.
            outcome = _settle(d, tool, args, ctx, detail, "the previous attempt may have applied")
        elif reserved.generation > 1 and retry.key_dropped(tool, age):
            # An earlier attempt sent this key, and the downstream no longer keeps it: sent
            # again, the write would be a new request. Settled as for a takeover.
            outcome = _settle(
                d, tool, args, ctx, detail, "the key of an earlier attempt is no longer kept"
            )
        if outcome is None:
            try:
                outcome = _handle(
                    d, tool, args, ctx, heartbeat, detail, age, delivery=reserved.generation
                )
            except StaleFence as err:
                d.trace("stale_fence_rejected", generation=reserved.generation, message=err.message)
                events.rejected_stale(
                    call, d.tool, DeliveryOutcome.STALE_FENCE, reserved.generation
                )
                return DeliveryOutcome.STALE_FENCE
    detail["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    metrics.executed(tool.name, time.monotonic() - started)
    d.audit = detail
    # The completion's own log record is written by ``events.completed`` (one per state change).
    d.spans.stage(tracing.COMPLETION)
    return _complete(d, lease, outcome)


class _Deadline:
    """A read's stand-in for a lease: it holds until the job timeout. A read has no
    reservation; a sweeper dispatches it again only once its worker is gone (or the job
    timeout passed), and only the first result committed counts."""

    def __init__(self, seconds: float) -> None:
        self._until = time.monotonic() + seconds

    def expired(self) -> bool:
        return time.monotonic() >= self._until


def _run_read(d: _Delivery, tool: Tool, args: Arguments, key: str, facts: Facts) -> DeliveryOutcome:
    """A read's fast path: no reservation, no lease, no operation row written. The handler
    runs and the call ends through ``endings.end_reads``, whose guard on the call's state is
    the only compare-and-set: a duplicate delivery may run the read again, and its result
    then matches no open call and is dropped."""
    rt, call = d.rt, d.call
    events.admitted(call, d.tool, d.loaded)
    d.spans.stage(tracing.HANDLER)
    started = time.monotonic()
    detail = dict(d.audit)
    deadline = _Deadline(rt.settings.job_timeout_seconds)
    ctx = ExecutionContext(
        tenant_id=call.tenant_id,
        user_id=call.user_id,
        operation_id=call.operation_id,
        idempotency_key=key,
        fencing_token=0,  # nothing to fence: a read changes nothing downstream
        request_id=call.request_id,
        canonical=facts.canonical,
        lease_lost=deadline.expired,
        on_effect=metrics.effect_reporter(tool.name, tool.kind),
    )
    try:
        outcome = _handle(d, tool, args, ctx, deadline, detail)
    except StaleFence:  # a read handler that raised it: a bug of the tool's, like any other
        log.exception("handler %s failed", tool.name)
        outcome = _failed(ErrorCode.EXECUTION_FAILED, "the tool failed")
    detail["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
    metrics.executed(tool.name, time.monotonic() - started)
    d.audit = detail
    d.spans.stage(tracing.COMPLETION)
    return _end_read(d, outcome)


def _reuse_read(d: _Delivery, prior: Mapping[str, Any]) -> DeliveryOutcome:
    status = str(prior["status"])
    payload = prior.get("data") if status == "succeeded" else prior.get("error")
    ended = _end_read(d, _Outcome(status, dict(payload or {})), reused=True)
    return DeliveryOutcome.REUSED if ended is not DeliveryOutcome.DUPLICATE_DELIVERY else ended


def _end_read(d: _Delivery, outcome: _Outcome, *, reused: bool = False) -> DeliveryOutcome:
    """Commit a read's outcome unless the call already ended, in a batch with the reads
    finishing beside it. A result Postgres cannot store ends the call with
    ``execution_failed``."""
    call = d.call
    # The result exists only here: an outage shorter than a lease must not drop it.
    retry = d.rt.settings.lease_seconds
    try:
        one = endings.ending(call.ref, outcome.status, outcome.payload, d.audit)
        ended, successors = d.batch.end(one, d.ticket, retry_seconds=retry)
    except UnstorableValue as exc:
        log.warning("call %s: %s", call.call_id, exc.message)
        outcome = _failed(ErrorCode.EXECUTION_FAILED, "the result cannot be stored")
        audit = {**d.audit, "unstorable": True}
        one = endings.ending(call.ref, outcome.status, outcome.payload, audit)
        ended, successors = d.batch.end(one, d.ticket, retry_seconds=retry)
    transport.dispatch_after_commit(
        d.rt.queue, successors, timeout=d.rt.settings.job_timeout_seconds, who="worker"
    )
    if not ended:
        # Another delivery of this read ended the call first; its result stands.
        d.trace("duplicate_delivery", reason="ended", status=outcome.status)
        return DeliveryOutcome.DUPLICATE_DELIVERY
    code = outcome.payload.get("code")
    d.status, d.code = outcome.status, code
    if reused:
        events.reused(call, d.tool, 1)
    else:
        events.completed(call, d.tool, outcome.status, code, 1)
    return DeliveryOutcome(outcome.status)


def _handle(
    d: _Delivery,
    tool: Tool,
    args: Arguments,
    ctx: ExecutionContext,
    heartbeat: retry.Lease,
    detail: dict[str, Any],
    key_age_seconds: float = 0.0,
    delivery: int = 1,
) -> _Outcome:
    """Run the handler and classify what happened. ``StaleFence`` propagates. ``delivery``:
    which run of the operation this is (its generation)."""
    started = time.monotonic()
    try:
        raw = retry.run_handler(
            tool,
            args,
            ctx,
            heartbeat,
            attempts=d.rt.settings.retry_attempts,
            budget_seconds=d.rt.settings.retry_budget_seconds,
            key_age_seconds=key_age_seconds,
        )
    except StaleFence:
        raise
    except ToolError as err:
        age = key_age_seconds + time.monotonic() - started
        if err.retryable and err.applied is not False and not retry.safe_to_repeat(tool, age):
            # "Try again later" from a write that may have applied (a timeout after the
            # request left) and that nothing downstream deduplicates: not a retry.
            settled = _settle(d, tool, args, ctx, detail, "the write may have applied")
            return settled or _Outcome(results.failure_status(err), results.failure_error(err))
        return _Outcome(results.failure_status(err), results.failure_error(err))
    except Exception as exc:  # a handler bug, a job timeout: never leak its text to the model
        age = key_age_seconds + time.monotonic() - started
        transient = retry.transient_failure(exc)
        if tool.kind == "write" and retry.safe_to_repeat(tool, age):
            if transient and delivery < retry.REPEAT_SAFE_DELIVERIES:
                # A dropped connection to the downstream (a database restart, a terminated
                # backend, a reset socket) with the retry budget spent. The write may have
                # applied, but its downstream replays the key (or it is idempotent): it is
                # re-sent, never sent to reconciliation. This delivery stops renewing its
                # lease; once the lease expires a sweeper dispatches the call again and the
                # new owner sends it with the same key and a larger fence.
                raise _LeaseLetGo(exc) from exc
            # Out of deliveries, or a failure that is not the downstream's (a bug) after its
            # retries in place: the outcome is unknown, but a resend under the same
            # operation id is safe (the key), so the application may make one.
            log.warning("handler %s failed (delivery %d): %s", tool.name, delivery, exc)
            code = ErrorCode.UPSTREAM_UNAVAILABLE if transient else ErrorCode.EXECUTION_FAILED
            return _failed_retryable(
                code, f"the tool failed in {delivery} deliveries; {results.RESEND_IS_SAFE}"
            )
        if transient and retry.safe_to_repeat(tool, age):
            log.warning("handler %s: the downstream is unreachable: %s", tool.name, exc)
            return _failed_retryable(
                ErrorCode.UPSTREAM_UNAVAILABLE, "the downstream is unreachable"
            )
        log.exception("handler %s failed", tool.name)
        failed = _failed(ErrorCode.EXECUTION_FAILED, "the tool failed")
        if tool.kind == "read":
            return failed
        # The write's outcome is unknown, which is not a failure: it may have applied.
        return _settle(d, tool, args, ctx, detail, "the write's outcome is unknown") or failed
    metrics.side_effects_returned(tool.name, tool.kind, ctx.effects)
    return _succeeded(tool, raw, detail)


def _succeeded(tool: Tool, raw: Mapping[str, Any], detail: dict[str, Any]) -> _Outcome:
    payload, notes = results.safe_result(tool, raw)
    if notes:
        detail["result_notes"] = notes
    audited = tool.audited(raw)
    if audited is not None:
        # The trace links each resource id to the call; an id is tool output like any other.
        detail["resources"] = [redaction.redact_secrets(r) for r in audited]
    return _Outcome("succeeded", payload)


def _settle(
    d: _Delivery,
    tool: Tool,
    args: Arguments,
    ctx: ExecutionContext,
    detail: dict[str, Any],
    why: str,
) -> _Outcome | None:
    """Settle a write that may have applied with the tool's status lookup: its result if it
    applied, ``None`` if it did not (running it, or reporting the failure, is then safe).
    Without a lookup, or if the lookup cannot tell, a person reconciles it."""
    if tool.lookup is None:
        return _reconciliation(why)
    lookup = tool.lookup
    try:
        found = retry.lookup(lambda: lookup(args, ctx), d.rt.settings)
    except Exception:
        log.exception("status lookup of %s failed", tool.name)
        d.verdicts["lookup"] = "unknown"
        return _reconciliation(f"{why}, and the status lookup could not tell")
    d.verdicts["lookup"] = "applied" if found is not None else "not_applied"
    return None if found is None else _succeeded(tool, found, detail)


@dataclass(frozen=True)
class _Outcome:
    """A terminal status and its payload (the safe result, or the error)."""

    status: str
    payload: dict[str, Any]


class _LeaseLetGo(Exception):
    """A repeat-safe write met a transient failure beyond its retry budget: end this
    delivery without an outcome and let the lease lapse (see ``_handle``)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _failed_retryable(code: ErrorCode, message: str) -> _Outcome:
    return _Outcome("failed_retryable", results.safe_error(code.value, [{"message": message}]))


def _reconciliation(message: str) -> _Outcome:
    return _failed(ErrorCode.RECONCILIATION_PENDING, message)


def _failed(code: ErrorCode, message: str) -> _Outcome:
    """A terminal failure whose one detail says, safely, what happened."""
    return _Outcome("failed_terminal", results.safe_error(code.value, [{"message": message}]))


def _complete(d: _Delivery, lease: reservations.Lease, outcome: _Outcome) -> DeliveryOutcome:
    """Commit ``outcome`` under ``lease``. A result Postgres cannot store still ends the
    call: with ``execution_failed`` for a read, ``reconciliation_pending`` for a write (it
    applied; its result is lost)."""
    with d.rt.held.hold():
        return _complete_held(d, lease, outcome)


def _complete_held(d: _Delivery, lease: reservations.Lease, outcome: _Outcome) -> DeliveryOutcome:
    # The result exists only here: PostgreSQL being unreachable for longer than one
    # statement's retries must not drop it while the lease could still be ours.
    retry = d.rt.settings.lease_seconds
    try:
        done = completions.completion(lease, outcome.status, outcome.payload, d.audit)
        finished = d.batch.complete(done, d.ticket, retry_seconds=retry)
    except UnstorableValue as exc:
        log.warning("call %s: %s", d.call.call_id, exc.message)
        if d.call.kind == "write" and outcome.status == "succeeded":
            fallback = _reconciliation("the write applied but its result cannot be stored")
        else:
            fallback = _failed(ErrorCode.EXECUTION_FAILED, "the result cannot be stored")
        done = completions.completion(
            lease, fallback.status, fallback.payload, {"unstorable": True}
        )
        finished = d.batch.complete(done, d.ticket, retry_seconds=retry)
        outcome = fallback
    if not finished.won:
        d.trace("stale_completion_rejected", generation=lease.generation, status=outcome.status)
        events.rejected_stale(d.call, d.tool, DeliveryOutcome.STALE_COMPLETION, lease.generation)
        return DeliveryOutcome.STALE_COMPLETION
    _finish(d.rt, finished)
    code = outcome.payload.get("code")
    d.status, d.code = outcome.status, code
    events.completed(d.call, d.tool, outcome.status, code, finished.finished, lease.generation)
    if code == ErrorCode.RECONCILIATION_PENDING:
        return DeliveryOutcome.RECONCILIATION_PENDING
    return DeliveryOutcome(outcome.status)


def _refuse(
    d: _Delivery, intent: str, err: ToolError, canonical: Mapping[str, Any]
) -> DeliveryOutcome:
    """End the operation with a refusal decided on server state, unless another delivery
    reserved or finished it first (then that delivery's outcome stands)."""
    outcome = reservations.refuse(
        d.rt.engine,
        operation_id=d.call.operation_id,
        call_ref=d.call.ref,
        intent_hash=intent,
        canonical=canonical,
        **_refusal(err, d),
    )
    if isinstance(outcome, reservations.NotReserved):
        return _lost(d, outcome, intent)
    _finish(d.rt, outcome)
    events.refused(d.call, d.tool, **_refusal_facts(d, err), count=outcome.finished)
    return DeliveryOutcome.REFUSED


def _lost(d: _Delivery, lost: reservations.NotReserved, intent: str) -> DeliveryOutcome:
    """A guarded statement matched no row: act on why, without changing anything else."""
    if lost.reason == "done":
        return _reuse(d, intent)
    if lost.reason == "conflict":
        d.verdicts["idempotency"] = ErrorCode.IDEMPOTENCY_CONFLICT.value
        if lost.call_state == "started":
            return _conclude_conflict(d, lost)
        conflict = ToolError(
            "this operation id was registered with a different intent",
            code=ErrorCode.IDEMPOTENCY_CONFLICT,
        )
        return _reject(d, conflict)
    # busy: another live owner runs it, and its completion ends every open call of the
    # operation; ended: another delivery already finished this call.
    d.trace("duplicate_delivery", reason=lost.reason, generation=lost.generation)
    return DeliveryOutcome.DUPLICATE_DELIVERY


def _conclude_conflict(d: _Delivery, lost: reservations.NotReserved) -> DeliveryOutcome:
    """This call was started under an intent that no longer computes the same (a tool or
    schema version, or an allowlist, changed during a crash gap). It can neither be reused
    nor run again: once its owner's lease has expired, its operation ends, with
    ``reconciliation_pending`` for a write (it may have applied) and ``idempotency_conflict``
    for a read."""
    if lost.op_state == "in_progress" and not lost.lease_expired:
        d.trace("duplicate_delivery", reason="owner_alive", generation=lost.generation)
        return (
            DeliveryOutcome.DUPLICATE_DELIVERY
        )  # the owner's completion ends it, or its lease expires
    if d.call.kind == "write":
        error = _reconciliation("the tool changed while this write was in flight").payload
    else:
        error = _failed(
            ErrorCode.IDEMPOTENCY_CONFLICT, "the tool changed while this call was in flight"
        ).payload
    with db.autocommit(d.rt.engine) as conn:
        if lost.op_state == "in_progress":
            finished = reservations.conclude(
                conn,
                operation_id=d.call.operation_id,
                generation=lost.generation,
                error=error,
                event="intent_changed",
                detail=d.audit,
            )
        else:
            finished = reservations.abandon(
                conn, call_ref=d.call.ref, error=error, event="intent_changed", detail=d.audit
            )
    if not finished.finished:
        d.trace("duplicate_delivery", reason="conclude_lost", generation=lost.generation)
        return DeliveryOutcome.DUPLICATE_DELIVERY
    _finish(d.rt, finished)
    events.concluded(d.call, d.tool, error, finished.finished, lost.op_state == "in_progress")
    return DeliveryOutcome.CONCLUDED


def _reject(d: _Delivery, err: ToolError) -> DeliveryOutcome:
    """End this call, if no delivery started it, with a refusal decided on the call alone."""
    finished = reservations.reject(d.rt.engine, call_ref=d.call.ref, **_refusal(err, d))
    if not finished.finished:
        # Another delivery reserved it (or ended it) first; its outcome stands.
        d.trace("duplicate_delivery", reason="call_not_proposed", refused=err.code.value)
        return DeliveryOutcome.DUPLICATE_DELIVERY
    _finish(d.rt, finished)
    events.refused(d.call, d.tool, **_refusal_facts(d, err), count=finished.finished)
    return DeliveryOutcome.REJECTED


def _reuse(d: _Delivery, intent: str) -> DeliveryOutcome:
    finished = reservations.reuse(
        d.rt.engine, call_ref=d.call.ref, intent_hash=intent, detail=d.audit
    )
    _finish(d.rt, finished)
    events.reused(d.call, d.tool, finished.finished)
    return DeliveryOutcome.REUSED if finished.finished else DeliveryOutcome.DUPLICATE_DELIVERY


def _finish(rt: Runtime, finished: endings.Finished) -> None:
    """Dispatch the calls a finish unblocked (committed: the sweeper covers a Redis
    failure)."""
    transport.dispatch_after_commit(
        rt.queue, finished.successors, timeout=rt.settings.job_timeout_seconds, who="worker"
    )


def _plain(args: Arguments) -> dict[str, Any]:
    return args.model_dump(mode="json") if isinstance(args, BaseModel) else dict(args)


def _refusal(err: CallgateError, d: _Delivery) -> dict[str, Any]:
    return {
        "status": results.failure_status(err),
        "error": results.failure_error(err),
        "detail": d.audit,
    }


def _refusal_facts(d: _Delivery, err: CallgateError) -> dict[str, Any]:
    """Called once this delivery's refusal ended the call."""
    d.status, d.code = results.failure_status(err), err.code.value
    return {
        "verdicts": d.verdicts,
        "status": results.failure_status(err),
        "code": err.code.value,
        "since": d.loaded,
    }
