"""One delivery of one call: gate → reserve → handler(key, fence) → complete.

Every path ends in exactly one of: the call's terminal result committed (by this delivery or
an earlier one), or a counted trace event that changes nothing (duplicate delivery, stale
owner, waiting for the previous write). Nothing here trusts RQ to deliver once.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from pydantic import BaseModel
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from store import calls, reservations, transport
from store.errors import CallgateError, ErrorCode, StaleFence, ToolError
from store.turns import RAW_ARGUMENTS
from store.types import TERMINAL_STATES
from worker import gate
from worker.heartbeat import Heartbeat
from worker.intent import idempotency_key, intent_hash
from worker.registry import ExecutionContext, Tool
from worker.runtime import Runtime

log = logging.getLogger("callgate.worker")

HANDLER_ATTEMPTS = 3


def execute(rt: Runtime, ref: uuid.UUID) -> str:
    """Run one delivery of call ``ref``. Returns what happened, for logs and tests."""
    call = calls.load(rt.engine, ref)
    if call is None:
        log.warning("job for unknown call %s dropped", ref)
        return "unknown_call"

    def trace(event: str, **detail: Any) -> None:
        reservations.trace(
            rt.engine,
            event=event,
            turn_id=call.turn_id,
            call_ref=call.ref,
            operation_id=call.operation_id,
            generation=detail.pop("generation", None),
            detail=detail,
        )

    if call.state in TERMINAL_STATES:
        trace("duplicate_delivery", state=call.state)
        return "duplicate_delivery"
    if call.after_call is not None and call.after_state not in TERMINAL_STATES:
        # The previous write's completion dispatches this one; running now would reorder.
        trace("waiting_for_previous_write")
        return "waiting"

    try:
        tool, args = _gate(rt, call)
    except ToolError as err:
        _finish(
            rt,
            reservations.reject(
                rt.engine, call_ref=call.ref, status=_status(err), error=_error(err)
            ),
        )
        return "rejected"

    key = idempotency_key(call.tenant_id, tool.name, call.operation_id)
    intent = intent_hash(
        arguments=args.model_dump(mode="json"),
        tenant_id=call.tenant_id,
        user_id=call.user_id,
        tool_name=tool.name,
        tool_version=tool.version,
        schema_version=tool.schema_version,
    )
    owner = uuid.uuid4()
    reserved = reservations.reserve(
        rt.engine,
        operation_id=call.operation_id,
        call_ref=call.ref,
        turn_id=call.turn_id,
        owner_token=owner,
        intent_hash=intent,
        lease_seconds=rt.settings.lease_seconds,
    )
    if isinstance(reserved, reservations.NotReserved):
        if reserved.reason == "done":
            finished = reservations.reuse(rt.engine, call_ref=call.ref, intent_hash=intent)
            _finish(rt, finished)
            return "reused" if finished.finished else "duplicate_delivery"
        if reserved.reason == "conflict":
            conflict = ToolError(
                "this operation id was registered with a different intent",
                code=ErrorCode.IDEMPOTENCY_CONFLICT,
            )
            _finish(
                rt,
                reservations.reject(
                    rt.engine, call_ref=call.ref, status="failed_terminal", error=_error(conflict)
                ),
            )
            return "conflict"
        # Another live owner runs it; its completion ends every open call of the operation.
        trace("duplicate_delivery", reason=reserved.reason, generation=reserved.generation)
        return "duplicate_delivery"

    lease = reservations.Lease(call.operation_id, owner, reserved.generation, intent)
    ctx = ExecutionContext(
        tenant_id=call.tenant_id,
        user_id=call.user_id,
        operation_id=call.operation_id,
        idempotency_key=key,
        fencing_token=reserved.generation,
        request_id=call.request_id,
    )
    started = time.monotonic()
    with Heartbeat(rt.engine, lease, rt.settings.lease_seconds) as heartbeat:
        try:
            data = _run_handler(tool, args, ctx, heartbeat)
            status, payload = "succeeded", data
        except StaleFence as err:
            trace("stale_fence_rejected", generation=reserved.generation, message=err.message)
            return "stale_fence"
        except ToolError as err:
            status, payload = _status(err), _error(err)
        except Exception:  # a handler bug: never leak its text or traceback to the model
            log.exception("handler %s failed", tool.name)
            status = "failed_terminal"
            payload = {"code": ErrorCode.EXECUTION_FAILED.value, "details": []}
    finished = reservations.complete(rt.engine, lease, status=status, payload=payload)
    if not finished.won:
        trace("stale_completion_rejected", generation=reserved.generation, status=status)
        return "stale_completion"
    _finish(rt, finished)
    log.info(
        "call %s %s gen=%d %s in %.0f ms",
        call.call_id,
        tool.name,
        reserved.generation,
        status,
        (time.monotonic() - started) * 1000,
    )
    return status


def _gate(rt: Runtime, call: calls.CallRecord) -> tuple[Tool, BaseModel]:
    tool = gate.check_allowed(rt.registry, call.tool_name, call.roles)
    raw = call.arguments
    arguments = gate.parse_arguments(raw.get(RAW_ARGUMENTS, raw))
    return tool, gate.validate_arguments(tool, arguments)


def _run_handler(
    tool: Tool, args: BaseModel, ctx: ExecutionContext, heartbeat: Heartbeat
) -> dict[str, Any]:
    """Retry retryable failures with the same key and fence, while the lease holds."""
    retrying = Retrying(
        stop=stop_after_attempt(HANDLER_ATTEMPTS),
        wait=wait_exponential(multiplier=0.1, max=2),
        retry=retry_if_exception(
            lambda e: (
                isinstance(e, ToolError)
                and not isinstance(e, StaleFence)
                and e.retryable
                and not heartbeat.lost.is_set()
            )
        ),
        reraise=True,
    )
    return retrying(tool.handler, args, ctx)


def _finish(rt: Runtime, finished: reservations.Finished) -> None:
    """Dispatch the next write of each finished turn. If this is lost, the sweeper does it."""
    if finished.successors:
        transport.enqueue_calls(
            rt.queue, finished.successors, timeout=rt.settings.job_timeout_seconds
        )


def _status(err: CallgateError) -> str:
    return "failed_retryable" if err.retryable else "failed_terminal"


def _error(err: CallgateError) -> dict[str, Any]:
    return {"code": err.code.value, "details": err.details}
