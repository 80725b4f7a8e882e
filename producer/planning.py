"""How a turn's proposals are scheduled (SPEC §8). Pure: no I/O.

Reads run concurrently. Writes run one after another in proposal order: each write names
the write before it, and starts only once that one is terminal.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from store.errors import ErrorCode, InputError
from store.turns import PlannedCall
from store.types import CallContext, ProposedCall
from worker.intent import idempotency_key
from worker.registry import Registry


def plan(
    proposals: Sequence[ProposedCall],
    context: CallContext,
    registry: Registry,
    operation_ids: Mapping[str, str] | None = None,
) -> list[PlannedCall]:
    operation_ids = operation_ids or {}
    if not proposals:
        raise InputError("a turn needs at least one proposed call")
    seen: set[str] = set()
    for p in proposals:
        if p.call_id in seen:
            raise InputError(
                f"call id {p.call_id!r} appears twice in one turn",
                code=ErrorCode.INVALID_INPUT,
            )
        seen.add(p.call_id)
    if any(not op for op in operation_ids.values()):
        raise InputError("an operation id must not be empty")
    unknown = set(operation_ids) - seen
    if unknown:
        raise InputError(f"operation ids given for calls not in the turn: {sorted(unknown)}")

    planned: list[PlannedCall] = []
    previous_write: uuid.UUID | None = None
    for proposal in proposals:
        ref = uuid.uuid4()
        kind = registry.kind_of(proposal.tool_name)
        op = operation_ids.get(proposal.call_id) or f"op-{uuid.uuid4().hex}"
        planned.append(
            PlannedCall(
                ref=ref,
                proposal=proposal,
                kind=kind,
                operation_id=op,
                idempotency_key=idempotency_key(context.tenant_id, proposal.tool_name, op),
                after=previous_write if kind == "write" else None,
            )
        )
        if kind == "write":
            previous_write = ref
    return planned
