"""What ``submit`` accepts, checked before anything is recorded. Pure: no I/O.

A turn is refused whole (``InputError``, nothing stored) when any part of it could not be
recorded faithfully or would break a guarantee later:

- more than ``max_turn_calls`` proposals (``CALLGATE_MAX_TURN_CALLS``), or a call whose
  arguments serialise to more than ``max_call_bytes`` (``CALLGATE_MAX_CALL_BYTES``);
- an id (call id, operation id, request, tenant, user, role, conversation) that is empty,
  blank, longer than ``MAX_ID_LENGTH`` or holds an unprintable character; more than
  ``MAX_ROLES`` roles;
- a value PostgreSQL cannot store (a NUL, a lone surrogate), a number JSON cannot hold
  (NaN, Infinity, ``1e400``), nesting past ``MAX_JSON_DEPTH``, anything that is not JSON.

Arguments given as a JSON string (as providers send them) are refused with
``invalid_arguments_json`` when they parse to such a value or repeat a key: the same code
the provider adapters and the gate give for them. A string that simply is not JSON, or not
an object, is recorded as given: the gate's first check refuses it as that call's result,
so the model learns which call to fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from callgate.core import values
from callgate.core.errors import ErrorCode, InputError, JSONValueError
from callgate.core.settings import Settings
from callgate.core.types import CallContext, ProposedCall
from callgate.tools.intent import canonical_json

# Ids are names, not documents. Kept equal to ProposedCall's own bound on call ids.
MAX_ID_LENGTH = 200
MAX_ROLES = 64
MAX_JSON_DEPTH = values.MAX_JSON_DEPTH


@dataclass(frozen=True)
class Limits:
    """The configurable caps (``CALLGATE_MAX_CALL_BYTES``, ``CALLGATE_MAX_TURN_CALLS``)."""

    max_call_bytes: int
    max_turn_calls: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(max_call_bytes=settings.max_call_bytes, max_turn_calls=settings.max_turn_calls)


@dataclass(frozen=True)
class Submission:
    """A turn that passed every check, as typed values."""

    calls: list[ProposedCall]
    context: CallContext
    operation_ids: dict[str, str]


def check_submission(
    proposals: Sequence[ProposedCall | Mapping[str, Any]],
    context: CallContext | Mapping[str, Any],
    operation_ids: Mapping[str, str] | None,
    *,
    limits: Limits,
) -> Submission:
    """Type and check one turn's input; raise ``InputError`` (or a subclass) on the first
    fault, with a one-line message that names the field and never repeats a raw value."""
    if isinstance(proposals, str | bytes | Mapping) or not isinstance(proposals, Sequence):
        raise InputError("proposals must be a list of {call_id, tool_name, arguments}")
    if len(proposals) > limits.max_turn_calls:
        raise InputError(
            f"a turn may propose at most {limits.max_turn_calls} calls, this one has "
            f"{len(proposals)} (CALLGATE_MAX_TURN_CALLS)"
        )
    ctx = check_context(context)
    calls = [check_call(p, i, limits) for i, p in enumerate(proposals)]
    return Submission(calls=calls, context=ctx, operation_ids=_operation_ids(calls, operation_ids))


def _operation_ids(
    calls: list[ProposedCall], operation_ids: Mapping[str, str] | None
) -> dict[str, str]:
    """The turn's operation ids: ``operation_ids`` by call id, and each proposal's own
    ``operation_id``; a call named both ways must be named the same."""
    ids = check_operation_ids(operation_ids)
    for call in calls:
        if call.operation_id is None:
            continue
        where = f"call '{values.printable(call.call_id)}'"
        check_id(call.operation_id, f"{where}: operation_id")
        given = ids.get(call.call_id)
        if given is not None and given != call.operation_id:
            raise InputError(
                f"{where}: its proposal's operation_id and operation_ids name two different "
                "operations; give one"
            )
        ids[call.call_id] = call.operation_id
    return ids


def check_context(context: CallContext | Mapping[str, Any]) -> CallContext:
    if not isinstance(context, CallContext):
        if not isinstance(context, Mapping):
            raise InputError("context must be an object {request_id, tenant_id, user_id, roles}")
        try:
            context = CallContext.model_validate(dict(context))
        except ValidationError as exc:
            raise InputError(f"bad context: {first_error(exc)}") from None
    for name in ("request_id", "tenant_id", "user_id"):
        check_id(getattr(context, name), f"context {name}")
    if context.conversation_id is not None:
        check_id(context.conversation_id, "context conversation_id")
    if len(context.roles) > MAX_ROLES:
        raise InputError(f"context roles: at most {MAX_ROLES} roles, got {len(context.roles)}")
    for role in context.roles:
        check_id(role, "context role")
    return context


def check_call(
    proposal: ProposedCall | Mapping[str, Any], index: int, limits: Limits
) -> ProposedCall:
    if not isinstance(proposal, ProposedCall):
        if not isinstance(proposal, Mapping):
            raise InputError(f"proposal {index}: not an object {{call_id, tool_name, arguments}}")
        try:
            proposal = ProposedCall.model_validate(dict(proposal))
        except ValidationError as exc:
            raise InputError(f"proposal {index}: {first_error(exc)}") from None
    check_id(proposal.call_id, f"proposal {index}: call_id")
    where = f"call '{values.printable(proposal.call_id)}'"
    reason = values.unstorable(proposal.tool_name)
    if reason is not None:
        raise InputError(f"{where}: tool_name holds {reason}")
    check_argument_limits(proposal.arguments, where, limits)
    return proposal


def check_argument_limits(arguments: Mapping[str, Any] | str, where: str, limits: Limits) -> None:
    """Arguments PostgreSQL can store and the gate will read as they were meant."""
    if isinstance(arguments, str):
        # Measured before parsing, so a huge string costs no parse.
        _check_size(len(arguments.encode("utf-8", "surrogatepass")), where, limits)
        reason = values.unstorable(arguments)
        if reason is not None:
            raise InputError(
                f"{where}: arguments hold {reason}", code=ErrorCode.INVALID_ARGUMENTS_JSON
            )
        try:
            values.loads(arguments)
        except JSONValueError as exc:
            if exc.syntax:
                return  # recorded as given; the gate refuses it as this call's result
            raise InputError(
                f"{where}: arguments: {exc.message}", code=ErrorCode.INVALID_ARGUMENTS_JSON
            ) from None
        return
    try:
        values.check(arguments)
    except JSONValueError as exc:
        raise InputError(f"{where}: arguments: {exc.message}") from None
    _check_size(len(canonical_json(arguments).encode()), where, limits)


def _check_size(size: int, where: str, limits: Limits) -> None:
    if size > limits.max_call_bytes:
        raise InputError(
            f"{where}: arguments are {size} bytes, at most {limits.max_call_bytes} are "
            "accepted (CALLGATE_MAX_CALL_BYTES)"
        )


def check_operation_ids(operation_ids: Mapping[str, str] | None) -> dict[str, str]:
    if operation_ids is None:
        return {}
    if not isinstance(operation_ids, Mapping):
        raise InputError("operation_ids must map call ids to operation ids")
    checked: dict[str, str] = {}
    for call_id, op in operation_ids.items():
        check_id(call_id, "operation_ids: a call id")
        check_id(op, f"operation id for call '{values.printable(call_id)}'")
        checked[call_id] = op
    return checked


def check_id(value: object, what: str) -> None:
    """An id is 1 to ``MAX_ID_LENGTH`` printable characters, not only spaces."""
    if not isinstance(value, str):
        raise InputError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{what} is empty or only spaces")
    if len(value) > MAX_ID_LENGTH:
        raise InputError(f"{what} is {len(value)} characters long, at most {MAX_ID_LENGTH}")
    if not value.isprintable():
        bad = next(ch for ch in value if not ch.isprintable())
        raise InputError(
            f"{what} '{values.printable(value)}' holds an unprintable character "
            f"(U+{ord(bad):04X}); ids are printable text"
        )


def check_timeout(seconds: float, what: str = "timeout") -> None:
    """A wait is a finite number of seconds, 0 or more (NaN would never compare as done,
    infinity never returns)."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 0:
        raise InputError(f"{what} must be a finite number of seconds, 0 or more")


def first_error(exc: ValidationError) -> str:
    """Pydantic's first complaint, made one printable line; never the received value."""
    err = exc.errors(include_input=False, include_url=False)[0]
    where = "/".join(values.printable(str(p), 40) for p in err["loc"]) or "(root)"
    return f"{where}: {values.printable(str(err['msg']), 200)}"
