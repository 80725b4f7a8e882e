"""Run one call through the gate and its handler in this process: for an application's unit
tests of its own tools, with no PostgreSQL, no Redis and no worker.

The same gate functions as the worker (``callgate.tools.gate``), in the worker's order:
allowlist → parse → schema → status lookup → business → authorization → risk → approval →
handler. The handler gets the context a first delivery gets: the idempotency key of
``(tenant, tool, operation_id)`` and fencing token 1. The result is the value ``collect``
returns (``Succeeded``, ``FailedRetryable``, ``FailedTerminal``), with the same safe
envelope (projection, redaction, caps), or ``AwaitingApproval`` for a call a person must
approve.

Not exercised here: the queue, the reservation (the compare-and-set on the operation), the
lease and its renewal, fencing of a stale owner, the outbox and the relayer, redelivery and
takeover after a crash, the handler's retries and back-off, the turn's budgets and
repeated-call memory, and the status lookup that settles a write of unknown outcome. Test
those against real services (see docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from callgate.core.errors import CallgateError, ErrorCode, ToolError
from callgate.core.types import FailedRetryable, FailedTerminal, Succeeded
from callgate.tools import gate, results
from callgate.tools.intent import idempotency_key
from callgate.tools.registry import ExecutionContext, Principal, Registry, Tool
from callgate.worker import aio

# A first delivery reserves generation 0 → 1: its fencing token.
FIRST_FENCE = 1


@dataclass(frozen=True)
class AwaitingApproval:
    """The call's risk policy asks for a person's approval; ``impact`` is what they see."""

    call_id: str
    tool_name: str
    impact: dict[str, Any]
    status: Literal["awaiting_approval"] = "awaiting_approval"


LocalResult = Succeeded | FailedRetryable | FailedTerminal | AwaitingApproval


@dataclass
class LocalRunner:
    """``LocalRunner(registry).call(name, args, principal=..., approved_by=...)``.

    ``contexts`` keeps every ``ExecutionContext`` a handler was given, in order."""

    registry: Registry
    principal: Principal | None = None
    contexts: list[ExecutionContext] = field(default_factory=list)

    def call(
        self,
        tool_name: str,
        arguments: Mapping[str, Any] | str,
        *,
        principal: Principal | None = None,
        approved_by: str | None = None,
        denied_by: str | None = None,
        call_id: str = "call_1",
        operation_id: str | None = None,
        request_id: str = "req-local",
    ) -> LocalResult:
        who = principal or self.principal or self._default_principal()
        ran: Tool | None = None
        verdicts: dict[str, str] = {}
        try:
            # The worker's pipeline, layer for layer (tools.gate).
            tool, args = gate.admit_call(self.registry, tool_name, arguments, who.roles, verdicts)
            facts = gate.resolve_facts(tool, args, who)
            impact = gate.judge(tool, args, facts, who, verdicts)
            if impact is not None:
                decided = self._decide(approved_by, denied_by, who)
                if decided is None:
                    return AwaitingApproval(call_id=call_id, tool_name=tool_name, impact=impact)
            op = operation_id or f"op-{call_id}"
            ctx = ExecutionContext(
                tenant_id=who.tenant_id,
                user_id=who.user_id,
                operation_id=op,
                idempotency_key=idempotency_key(who.tenant_id, tool.name, op),
                fencing_token=FIRST_FENCE,
                request_id=request_id,
                canonical=facts.canonical,
            )
            self.contexts.append(ctx)
            ran = tool
            raw = aio.call(tool.handler, args, ctx)
        except CallgateError as err:
            return _failure(call_id, tool_name, err)
        except Exception:  # a handler bug: the worker never shows its text to a model either
            if ran is not None and ran.kind == "write" and ran.safe_to_repeat():
                # As in the worker once its retries are spent: the key makes a resend safe.
                error = results.safe_error(
                    ErrorCode.EXECUTION_FAILED.value,
                    [{"message": f"the tool failed; {results.RESEND_IS_SAFE}"}],
                )
                return FailedRetryable.model_validate(
                    {"call_id": call_id, "tool_name": tool_name, "error": error}
                )
            failed = ToolError("the tool failed", code=ErrorCode.EXECUTION_FAILED)
            return _failure(call_id, tool_name, failed)
        payload, _notes = results.safe_result(tool, raw)
        return Succeeded(call_id=call_id, tool_name=tool_name, data=payload)

    def _default_principal(self) -> Principal:
        # Every role of the registry's allowlist, so a first test is not refused at layer 1.
        return Principal("tenant-test", "user-test", tuple(sorted(self.registry.allowlist)))

    @staticmethod
    def _decide(approved_by: str | None, denied_by: str | None, who: Principal) -> bool | None:
        decider = denied_by or approved_by
        if decider is not None and gate.same_person(who.user_id, decider):
            raise ToolError(
                f"{decider} asked for this call and cannot decide its approval",
                code=ErrorCode.APPROVAL_FORBIDDEN,
            )
        if denied_by is not None:
            raise ToolError("an approver denied this action", code=ErrorCode.APPROVAL_DENIED)
        return True if approved_by is not None else None


def _failure(call_id: str, tool_name: str, err: CallgateError) -> FailedRetryable | FailedTerminal:
    error = results.failure_error(err)
    if err.retryable:
        return FailedRetryable.model_validate(
            {"call_id": call_id, "tool_name": tool_name, "error": error}
        )
    return FailedTerminal.model_validate(
        {"call_id": call_id, "tool_name": tool_name, "error": error}
    )
