"""The API's request and response bodies, as pydantic models (they make the OpenAPI
document, and the schema tests check every answer against it)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Surface = Literal[
    "openai-chat",
    "openai-responses",
    "anthropic-messages",
    "gemini-generate-content",
    "gemini-interactions",
]
ApprovalState = Literal["pending", "approved", "denied", "superseded", "all"]


class Proposal(BaseModel):
    call_id: str = Field(description="The provider's tool call id")
    tool_name: str
    arguments: dict[str, Any] | str = Field(description="An object, or its JSON text")
    operation_id: str | None = Field(
        default=None,
        description="The application's id for this write: the same id again (a retry, or the "
        "same write proposed in another turn) reuses the first result instead of running it "
        "again. Without one, an id is made (from the Idempotency-Key, if given).",
    )
    repeat: bool = Field(
        default=False,
        description="The application means this write again in its conversation (a second "
        "refund the user asked for). Without it, a write that repeats one of the "
        "conversation's that succeeded or has not ended ends repeated_call.",
    )


class SubmittedCall(BaseModel):
    call_id: str
    tool_name: str
    operation_id: str


class Submitted(BaseModel):
    """What ``callgate submit --json`` prints; ``turn_id`` null and no calls for a provider
    response that is a final answer (nothing recorded)."""

    turn_id: str | None
    calls: list[SubmittedCall]


class CollectedTurn(BaseModel):
    """What ``callgate collect --json`` prints."""

    turn_id: str
    complete: bool
    results: list[dict[str, Any]]
    pending: list[str]
    awaiting_approval: dict[str, str]


class ApprovalCall(BaseModel):
    call_id: str
    tool_name: str
    state: str
    result: dict[str, Any] | None


class Approval(BaseModel):
    approval_id: str
    version: int
    state: str
    tool_name: str
    tenant_id: str
    requested_by: str
    operation_id: str
    intent_hash: str
    policy_version: str
    impact: dict[str, Any] = Field(description="Computed by the server, never by the model")
    decided_by: str | None
    created_at: str
    decided_at: str | None
    call_ids: list[str]
    age_seconds: float
    notice: str | None = Field(
        description="Set when the intent changed and a new decision is (or was) needed"
    )


class ApprovalDetail(Approval):
    calls: list[ApprovalCall]


class Decision(BaseModel):
    approval_id: str
    state: Literal["approved", "denied"]
    decided_by: str
    calls: int = Field(description="Calls resumed (approved) or ended approval_denied")


class TraceEvent(BaseModel):
    at: str
    # A provider's call id may be reused by another turn: each event says whose it is.
    turn_id: str
    call_id: str | None
    tool_name: str | None
    operation_id: str | None
    event: str
    generation: int | None
    detail: Any


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    postgres: bool
    redis: bool


class SignIn(BaseModel):
    key: str = Field(min_length=1, max_length=400)


class Session(BaseModel):
    tenant_id: str
    user_id: str
    csrf_token: str
