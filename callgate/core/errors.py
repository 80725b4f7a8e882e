"""One exception root with stable, documented error codes.

Every error a person or a model can see carries a ``code`` from ``ErrorCode``. Driver errors
are translated at the boundary (``raise ... from exc``) so domain code never sees psycopg or
redis exception types.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    # The gate, in gate order.
    UNKNOWN_TOOL = "unknown_tool"
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    INVALID_ARGUMENTS_JSON = "invalid_arguments_json"
    INVALID_ARGUMENTS = "invalid_arguments"
    # Business validation against server state (tool-specific).
    REFUND_AMOUNT_EXCEEDED = "refund_amount_exceeded"
    CURRENCY_MISMATCH = "currency_mismatch"
    NOT_FOUND = "not_found"
    BATCH_LIMIT_EXCEEDED = "batch_limit_exceeded"
    # The resource changed since the version the arguments name (read it again).
    STALE_VERSION = "stale_version"
    PERMISSION_DENIED = "permission_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DENIED = "approval_denied"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    OPERATION_IN_PROGRESS = "operation_in_progress"
    # Loop and budget, decided when the turn is recorded.
    BUDGET_EXCEEDED = "budget_exceeded"
    REPEATED_CALL = "repeated_call"
    # Execution.
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    STALE_FENCE = "stale_fence"
    RECONCILIATION_PENDING = "reconciliation_pending"
    EXECUTION_FAILED = "execution_failed"
    DELIVERY_EXHAUSTED = "delivery_exhausted"
    # Correlation of results with proposals.
    MISSING_RESULT = "missing_result"
    DUPLICATE_RESULT = "duplicate_result"
    EXTRA_RESULT = "extra_result"
    TOOL_NAME_MISMATCH = "tool_name_mismatch"
    NON_TERMINAL_RESULT = "non_terminal_result"
    # Provider envelopes and MCP results.
    INVALID_PROVIDER_ENVELOPE = "invalid_provider_envelope"
    MISSING_TOOL_CALLS = "missing_tool_calls"
    MALFORMED_TOOL_CALLS = "malformed_tool_calls"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    INVALID_TOOL_CALL_FIELD = "invalid_tool_call_field"
    UNSUPPORTED_SURFACE = "unsupported_surface"
    MCP_INVALID_PARAMS = "mcp_invalid_params"
    MCP_WIRE_ERROR = "mcp_wire_error"
    MCP_TOOL_EXECUTION_FAILED = "mcp_tool_execution_failed"
    MCP_RESPONSE_ID_MISMATCH = "mcp_response_id_mismatch"
    # A read whose structuredContent does not match the tool's published outputSchema.
    MCP_INVALID_OUTPUT = "mcp_invalid_output"
    # The run_python tool's sandbox (callgate.worker.sandbox): a run past one of its limits.
    SANDBOX_TIMEOUT = "sandbox_timeout"
    SANDBOX_CPU = "sandbox_cpu"
    SANDBOX_MEMORY = "sandbox_memory"
    SANDBOX_PROCESSES = "sandbox_processes"
    SANDBOX_FILES = "sandbox_files"
    SANDBOX_OUTPUT_LIMIT = "sandbox_output_limit"
    # Input, configuration and infrastructure.
    INVALID_INPUT = "invalid_input"
    INVALID_CONFIGURATION = "invalid_configuration"
    # The database's callgate schema is not the one this code ships (never migrated, behind,
    # or ahead of it).
    NOT_MIGRATED = "not_migrated"
    UNKNOWN_TURN = "unknown_turn"
    # A turn a submit returned that a failover to a lagging PostgreSQL replica lost.
    TURN_LOST = "turn_lost"
    # An AsyncProducer used after aclose() (or whose wait aclose() ended).
    PRODUCER_CLOSED = "producer_closed"
    UNKNOWN_APPROVAL = "unknown_approval"
    APPROVAL_NOT_PENDING = "approval_not_pending"
    # Four eyes: the person who asked for an approval cannot decide it.
    APPROVAL_FORBIDDEN = "approval_forbidden"
    # Manual reconciliation of writes callgate cannot know the outcome of.
    UNKNOWN_OPERATION = "unknown_operation"
    NOT_AWAITING_RECONCILIATION = "not_awaiting_reconciliation"
    # The HTTP API (callgate api): keys, roles, rate limits, the console's CSRF token.
    UNAUTHENTICATED = "unauthenticated"
    ROLE_REQUIRED = "role_required"
    RATE_LIMITED = "rate_limited"
    TOO_MANY_WAITS = "too_many_waits"
    BODY_TOO_LARGE = "body_too_large"
    # A request body not whole within CALLGATE_API_BODY_TIMEOUT of its head (HTTP 408).
    BODY_TIMEOUT = "body_timeout"
    CSRF_FAILED = "csrf_failed"
    UNKNOWN_API_KEY = "unknown_api_key"
    UNKNOWN_ROUTE = "unknown_route"
    DATABASE_UNAVAILABLE = "database_unavailable"
    REDIS_UNAVAILABLE = "redis_unavailable"
    EMBEDDED_SERVICE_FAILED = "embedded_service_failed"


# The codes for which the same call, unchanged, may succeed later (within a retry budget).
# Every other code is terminal: the model or a person must change something first.
RETRYABLE_CODES = frozenset(
    {
        ErrorCode.UPSTREAM_UNAVAILABLE,
        ErrorCode.OPERATION_IN_PROGRESS,
        ErrorCode.DATABASE_UNAVAILABLE,
        ErrorCode.REDIS_UNAVAILABLE,
        ErrorCode.RATE_LIMITED,
        ErrorCode.TOO_MANY_WAITS,
    }
)


class CallgateError(Exception):
    """Root of every error callgate raises on purpose."""

    code: ErrorCode = ErrorCode.EXECUTION_FAILED

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details or []

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ConfigurationError(CallgateError):
    code = ErrorCode.INVALID_CONFIGURATION


class InputError(CallgateError):
    """Malformed input from a user or an application (envelope, file, context)."""

    code = ErrorCode.INVALID_INPUT


class JSONValueError(InputError):
    """A value callgate will not record: not strict JSON, too deep, or not storable by
    PostgreSQL (a NUL, a lone surrogate). ``path`` is a JSON Pointer to it, already made
    printable; ``syntax`` is true when the text simply does not parse as JSON. Callers
    re-raise it with the code that fits where the value came from."""

    def __init__(self, message: str, *, path: str = "", syntax: bool = False) -> None:
        super().__init__(message)
        self.path = path
        self.syntax = syntax


class ServiceUnavailable(CallgateError):
    """Postgres or Redis could not be reached.

    Raised by ``submit``, it says what became of the turn: ``recorded`` is True (recorded,
    not yet enqueued: the sweeper dispatches it), False (nothing was recorded) or None (the
    outcome is unknown: the connection was lost during COMMIT); ``submit_key`` is the key
    to submit again with, which returns the turn if it was recorded and records it once if
    not. Both are None for other callers."""

    code = ErrorCode.DATABASE_UNAVAILABLE

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        details: list[dict[str, Any]] | None = None,
        submit_key: str | None = None,
        recorded: bool | None = None,
    ) -> None:
        if submit_key is not None:
            # Also in the details, so the HTTP problem body and the CLI carry it.
            details = [
                *(details or []),
                {"code": "submit_outcome", "submit_key": submit_key, "recorded": recorded},
            ]
        super().__init__(message, code=code, details=details)
        self.submit_key = submit_key
        self.recorded = recorded


class UnknownTurn(CallgateError):
    code = ErrorCode.UNKNOWN_TURN


class TurnLost(UnknownTurn):
    """A turn a submit returned, lost when PostgreSQL failed over to a replica that lacked
    it. Its calls may have run: its writes' operation ids stay in doubt."""

    code = ErrorCode.TURN_LOST


class ProducerClosed(CallgateError):
    code = ErrorCode.PRODUCER_CLOSED


class ApprovalError(CallgateError):
    """An approver acted on an approval that does not exist (or is another tenant's), is no
    longer pending, or that they asked for themselves."""

    code = ErrorCode.UNKNOWN_APPROVAL


class AccessError(CallgateError):
    """An HTTP API request without a valid key (``unauthenticated``), without the role it
    needs (``role_required``), over its key's rate (``rate_limited``, with ``retry_after``
    seconds) or without the console's CSRF token (``csrf_failed``); a key id ``callgate keys
    revoke`` does not know (``unknown_api_key``)."""

    code = ErrorCode.UNAUTHENTICATED

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        details: list[dict[str, Any]] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.retry_after = retry_after


class ReconciliationError(CallgateError):
    """A person tried to settle a write that does not exist or is not awaiting settling."""

    code = ErrorCode.UNKNOWN_OPERATION


class CorrelationError(CallgateError):
    """Results do not match proposals one to one."""

    code = ErrorCode.MISSING_RESULT


class AdapterError(CallgateError):
    """A provider envelope, stream, result set or MCP reply callgate refuses. ``code`` is
    stable. Here, not beside the adapters, because the worker's MCP client refuses replies
    with it too and the worker must not import the producer."""

    code = ErrorCode.INVALID_PROVIDER_ENVELOPE


class AdapterCorrelationError(AdapterError, CorrelationError):
    """Results do not match proposals one to one, found while serialising.

    Both an ``AdapterError`` (what the adapter entry points raise) and a ``CorrelationError``
    (what fan-in raises for the same fault), so either ``except`` clause catches it.
    """

    code = ErrorCode.MISSING_RESULT


class ToolError(CallgateError):
    """Raised by the gate or a tool handler; becomes the call's terminal error result.

    ``applied=False`` says the handler knows the downstream did not apply this attempt (it
    refused before writing, the connection was never opened): a retryable error is then
    safe to retry even for a write whose downstream takes no idempotency key. Left unset, a
    retryable error from such a write may have applied and goes to reconciliation.

    ``retry_after_ms``: the downstream's own hint (a rate limit's Retry-After, an MCP
    server's ``retryAfterMs``) for a retryable error. callgate's retries wait at least this
    long, and a call that ends ``failed_retryable`` carries it to the model.
    """

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        details: list[dict[str, Any]] | None = None,
        applied: bool | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.applied = applied
        self.retry_after_ms = retry_after_ms


class UnstorableValue(CallgateError):
    """A value PostgreSQL refuses to store (a NUL character, a non-finite number): no retry
    can ever commit it."""

    code = ErrorCode.EXECUTION_FAILED


class StaleFence(ToolError):
    """The downstream saw a larger fencing token for this key: this owner is stale."""

    code = ErrorCode.STALE_FENCE
