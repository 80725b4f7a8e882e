"""How a turn's proposals are scheduled. Pure: no I/O.

Reads run concurrently. Writes run one after another in proposal order: each write names
the write before it, and starts only once that one is terminal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from callgate.core import values
from callgate.core.errors import ErrorCode, InputError, JSONValueError
from callgate.core.types import CallContext, ProposedCall
from callgate.core.values import printable
from callgate.store.turns import PlannedCall
from callgate.tools.intent import canonical_json, idempotency_key
from callgate.tools.registry import Catalog


def plan(
    proposals: Sequence[ProposedCall],
    context: CallContext,
    registry: Catalog,
    operation_ids: Mapping[str, str] | None = None,
) -> list[PlannedCall]:
    operation_ids = operation_ids or {}
    if not proposals:
        raise InputError("a turn needs at least one proposed call")
    seen: set[str] = set()
    for p in proposals:
        if p.call_id in seen:
            raise InputError(
                f"call id '{printable(p.call_id)}' appears twice in one turn",
                code=ErrorCode.INVALID_INPUT,
            )
        seen.add(p.call_id)
    if any(not op for op in operation_ids.values()):
        raise InputError("an operation id must not be empty")
    unknown = set(operation_ids) - seen
    if unknown:
        shown = ", ".join(f"'{printable(c)}'" for c in sorted(unknown)[:5])
        raise InputError(f"operation ids given for calls not in the turn: {shown}")
    # One operation is one logical write with one result. Two calls of a turn sharing it
    # would get one result for two different intents (the second never runs).
    owner: dict[str, str] = {}
    for call_id, op in operation_ids.items():
        if op in owner:
            raise InputError(
                f"operation id '{printable(op)}' is given for two calls of one turn "
                f"('{printable(owner[op])}' and '{printable(call_id)}'); an operation id "
                "names one logical operation: issue one per call"
            )
        owner[op] = call_id

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
                args_hash=arguments_hash(proposal.arguments),
            )
        )
        if kind == "write":
            previous_write = ref
    return planned


def arguments_hash(arguments: Mapping[str, Any] | str) -> str:
    """Same tool + same arguments, whatever their key order or spelling."""
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = values.loads(arguments)
        except JSONValueError:
            value = {values.RAW_ARGUMENTS: arguments}
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def rechain(planned: Sequence[PlannedCall]) -> list[PlannedCall]:
    """Writes wait for the previous write that will run; refused writes never run."""
    out: list[PlannedCall] = []
    previous_write: uuid.UUID | None = None
    for p in planned:
        if p.kind == "write":
            out.append(dataclasses.replace(p, after=previous_write))
            if p.refusal is None:
                previous_write = p.ref
        else:
            out.append(p)
    return out
