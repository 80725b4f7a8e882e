"""What one delivery did, told twice: Prometheus counters (``callgate/observe/metrics.py``) and one
structured log record per state change (``callgate/core/logs.py``).

Each record carries the call's turn, call and operation ids and bounded facts (tool,
generation, status, code, layer), never arguments, results or secrets. The executor calls
one function per event, on one line, after the statement that made the change committed:
nothing here touches Postgres or Redis.

Records are written at INFO (``reconciliation_pending`` at WARNING: a person must act), so
the default level (WARNING) keeps a worker's hot path quiet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from callgate.core import logs
from callgate.core.errors import ErrorCode
from callgate.observe import metrics
from callgate.store.calls import CallRecord

log = logging.getLogger("callgate.worker")

RECONCILIATION_PENDING = ErrorCode.RECONCILIATION_PENDING.value


class DeliveryOutcome(StrEnum):
    """What one delivery did: ``executor.execute``'s answer. The values are labels that logs,
    traces and tests already read: keep them."""

    # The call's terminal result committed by this delivery (the operation's status).
    SUCCEEDED = "succeeded"
    FAILED_RETRYABLE = "failed_retryable"
    FAILED_TERMINAL = "failed_terminal"
    RECONCILIATION_PENDING = "reconciliation_pending"  # a write that may have applied
    REFUSED = "refused"  # a gate layer on server state said no (the operation ends)
    REJECTED = "rejected"  # refused on the call alone, before any reservation
    CONCLUDED = "concluded"  # the intent changed in flight; ended without running
    REUSED = "reused"  # the operation's earlier outcome is this call's too
    # Parked or deferred: another event finishes the call.
    AWAITING_APPROVAL = "awaiting_approval"
    WAITING = "waiting"  # the previous write's completion dispatches this one
    # Changed nothing (counted and traced).
    DUPLICATE_DELIVERY = "duplicate_delivery"
    STALE_FENCE = "stale_fence"  # the downstream refused this owner's generation
    STALE_COMPLETION = "stale_completion"  # the completion found a newer owner
    LEASE_LET_GO = "lease_let_go"  # the downstream stayed away; the lease lapses
    UNKNOWN_CALL = "unknown_call"  # the job names no call


def ids(call: CallRecord) -> dict[str, Any]:
    """The log fields that say which call a record is about."""
    return {
        "turn_id": call.turn_id,
        "call_id": call.call_id,
        "call_ref": call.ref,
        "operation_id": call.operation_id,
    }


def _event(level: int, event: str, call: CallRecord, tool: str, **facts: Any) -> None:
    if log.isEnabledFor(level):  # the ids cost nothing when the level is off
        logs.event(log, event, level, tool=tool, **ids(call), **facts)


def delivered(call: CallRecord, tool: str, outcome: DeliveryOutcome) -> DeliveryOutcome:
    """Count a delivery that changed nothing; returns ``outcome`` unchanged."""
    if outcome is DeliveryOutcome.DUPLICATE_DELIVERY:
        metrics.duplicate_delivery(tool)
    return outcome


def parked(call: CallRecord, tool: str, approval_id: Any) -> None:
    """The call now awaits an approver's decision (``awaiting_approval``)."""
    _event(logging.INFO, "awaiting_approval", call, tool, approval_id=approval_id)


def admitted(call: CallRecord, tool: str, since: float) -> None:
    """A read passed the gate and runs, with no reservation (a read's fast path)."""
    metrics.gate_verdict(tool, time.monotonic() - since)
    _event(logging.INFO, "admitted", call, tool)


def reserved(call: CallRecord, tool: str, generation: int, takeover: bool, since: float) -> None:
    """The operation is this delivery's at ``generation``: the gate's verdict was to run."""
    metrics.gate_verdict(tool, time.monotonic() - since)
    if takeover:
        metrics.lease_takeover(tool)
    name = "taken_over" if takeover else "reserved"
    _event(logging.INFO, name, call, tool, generation=generation)


def rejected_stale(
    call: CallRecord,
    tool: str,
    what: Literal[DeliveryOutcome.STALE_FENCE, DeliveryOutcome.STALE_COMPLETION],
    generation: int,
) -> None:
    """``stale_fence`` (the downstream refused this generation) or ``stale_completion`` (the
    completion found a newer owner): this owner's work changes nothing."""
    if what is DeliveryOutcome.STALE_FENCE:
        metrics.stale_fence(tool)
    else:
        metrics.stale_completion(tool)
    _event(logging.INFO, "rejected_stale", call, tool, generation=generation, code=what)


def completed(
    call: CallRecord,
    tool: str,
    status: str,
    code: str | None,
    count: int,
    generation: int | None = None,
    operation_ended: bool = True,
) -> None:
    """``count`` calls ended with the outcome of an operation that ran (or was concluded)."""
    metrics.result(tool, status, code, count)
    if operation_ended and metrics.counts_as_write_operation(call.kind, status, code):
        metrics.write_operation_completed(tool)
    if code == RECONCILIATION_PENDING:
        _event(logging.WARNING, "reconciliation_pending", call, tool, generation=generation)
    else:
        _event(
            logging.INFO,
            "completed",
            call,
            tool,
            status=status,
            code=code,
            generation=generation,
            count=count,
        )


def concluded(
    call: CallRecord, tool: str, error: Mapping[str, Any], count: int, operation_ended: bool
) -> None:
    """A call whose intent changed during a crash gap ended without running again: its
    operation too when ``operation_ended`` (its owner's lease had expired)."""
    if error.get("code") == ErrorCode.IDEMPOTENCY_CONFLICT.value:
        metrics.idempotency_conflict(tool)
    completed(call, tool, "failed_terminal", error.get("code"), count, None, operation_ended)


def refused(
    call: CallRecord,
    tool: str,
    *,
    verdicts: Mapping[str, str],
    status: str,
    code: str,
    count: int,
    since: float,
) -> None:
    """The gate refused: no handler ran, and ``count`` calls ended with the refusal."""
    layer = metrics.refusal_layer(verdicts, code)
    metrics.gate_verdict(tool, time.monotonic() - since)
    metrics.gate_refused(layer, code)
    if code == ErrorCode.IDEMPOTENCY_CONFLICT.value:
        metrics.idempotency_conflict(tool)
    metrics.result(tool, status, code, count)
    _event(logging.INFO, "refused", call, tool, layer=layer, status=status, code=code, count=count)


def reused(call: CallRecord, tool: str, count: int) -> None:
    """``count`` calls (0 or 1) ended with their operation's stored result."""
    if count:
        metrics.result_reused(tool)
        _event(logging.INFO, "result_reused", call, tool)
