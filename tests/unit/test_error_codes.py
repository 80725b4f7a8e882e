"""Every stable error code is documented, and classified terminal or retryable."""

from __future__ import annotations

from pathlib import Path

from callgate.core.errors import RETRYABLE_CODES, CallgateError, ErrorCode, ToolError

ERRORS = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def test_every_code_is_in_the_error_table() -> None:
    text = ERRORS.read_text()
    missing = [c.value for c in ErrorCode if f"| `{c.value}` |" not in text]
    assert missing == [], f"give these codes a row in docs/errors.md: {missing}"


def test_retryable_codes_are_exactly_the_transient_ones() -> None:
    assert {c.value for c in RETRYABLE_CODES} == {
        "upstream_unavailable",
        "operation_in_progress",
        "database_unavailable",
        "redis_unavailable",
        "rate_limited",  # the HTTP API: the same request after Retry-After
        "too_many_waits",  # the HTTP API: the same long-poll once one of the key's ends
    }
    assert ToolError("x", code=ErrorCode.UPSTREAM_UNAVAILABLE).retryable
    for code in ("approval_denied", "repeated_call", "budget_exceeded", "reconciliation_pending"):
        assert not CallgateError("x", code=ErrorCode(code)).retryable
