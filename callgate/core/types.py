"""The records callgate stores and hands back: proposals, context, results.

Plain typed values, no I/O. A result is a discriminated union on ``status``; there is no
``ok: bool`` with optional fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

TERMINAL_STATES = ("succeeded", "failed_retryable", "failed_terminal")
# Everything a tool produced, a failure's details included, reaches a model labelled as
# data: never an instruction, never a grant.
TRUST_LABEL = "untrusted_tool_output"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProposedCall(_Frozen):
    """A model's proposal: never a command until the gate says so."""

    call_id: str = Field(min_length=1, max_length=200)
    tool_name: str = Field(min_length=1, max_length=200)
    arguments: dict[str, Any] | str  # a str is raw JSON still to be parsed by the gate
    # The application's name for this write (its retry, or the same write proposed again in
    # another turn, reuses the first result); a model never supplies it. None: one is made.
    operation_id: str | None = Field(default=None, min_length=1, max_length=200)
    # The application says this write is meant again in its conversation (a second refund the
    # user asked for): not refused as a repeat of an earlier one. A model never supplies it.
    repeat: bool = False


class CallContext(_Frozen):
    """Server-trusted facts about who asked. Never taken from model arguments."""

    request_id: str = Field(min_length=1)
    tenant_id: str = Field(min_length=1)
    user_id: str = Field(min_length=1)
    roles: tuple[str, ...] = ()
    # Turns of one conversation share its call budget and its repeated-call memory.
    conversation_id: str | None = Field(default=None, min_length=1, max_length=200)


class SafeErrorDetail(_Frozen):
    code: str
    path: str | None = None
    expected: str | None = None
    message: str | None = None


class AppError(_Frozen):
    code: str
    details: tuple[SafeErrorDetail, ...] = ()
    retry_after_ms: int | None = None


class Succeeded(_Frozen):
    status: Literal["succeeded"] = "succeeded"
    call_id: str
    tool_name: str
    data: dict[str, Any]


class FailedRetryable(_Frozen):
    status: Literal["failed_retryable"] = "failed_retryable"
    call_id: str
    tool_name: str
    error: AppError


class FailedTerminal(_Frozen):
    status: Literal["failed_terminal"] = "failed_terminal"
    call_id: str
    tool_name: str
    error: AppError


CorrelatedResult = Annotated[
    Succeeded | FailedRetryable | FailedTerminal, Field(discriminator="status")
]
RESULT_ADAPTER: TypeAdapter[Succeeded | FailedRetryable | FailedTerminal] = TypeAdapter(
    CorrelatedResult
)


class TurnCall(_Frozen):
    """One recorded call of a turn, as ``submit`` returns it."""

    call_id: str
    tool_name: str
    operation_id: str
    ref: str  # callgate's own id for the call; RQ jobs carry this, never the payload


class Turn(_Frozen):
    turn_id: str
    calls: tuple[TurnCall, ...]
