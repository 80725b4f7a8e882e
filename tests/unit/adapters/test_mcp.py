"""MCP result normalisation beyond the reference fixture's cases."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.core.types import FailedRetryable, FailedTerminal, Succeeded
from callgate.producer.adapters import AdapterError
from callgate.worker.mcp.results import normalise_result, sanitise

Result = Succeeded | FailedRetryable | FailedTerminal


def normalise(response: object, request_id: str | int = "req-1") -> Result:
    return normalise_result(
        response, provider_call_id="call-1", tool_name="lookup", request_id=request_id
    )


def failure(text: str, **structured: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"isError": True, "content": [{"type": "text", "text": text}]}
    if structured:
        result["structuredContent"] = structured
    return {"jsonrpc": "2.0", "id": "req-1", "result": result}


def test_success_keeps_content_and_structured_content() -> None:
    response = {
        "jsonrpc": "2.0",
        "id": "req-1",
        "result": {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"temp": 21}},
    }
    assert normalise(response) == Succeeded(
        call_id="call-1",
        tool_name="lookup",
        data={"content": [{"type": "text", "text": "ok"}], "structuredContent": {"temp": 21}},
    )


@pytest.mark.parametrize(
    "response",
    [
        {"jsonrpc": "2.0", "id": "req-1", "error": {"code": -32601, "message": "Method not found"}},
        {"jsonrpc": "2.0", "id": "req-1", "error": {"code": "-32602"}},
        {"jsonrpc": "2.0", "id": "req-1", "error": "bad"},
        {"jsonrpc": "1.0", "id": "req-1", "result": {"content": []}},
        {"jsonrpc": "2.0", "id": "req-1"},
        {"jsonrpc": "2.0", "id": "req-1", "result": {"content": []}, "error": {"code": 1}},
        {"jsonrpc": "2.0", "id": "req-1", "result": []},
        {"jsonrpc": "2.0", "id": "req-1", "result": {"content": "text"}},
        {"jsonrpc": "2.0", "id": "req-1", "result": {"content": [], "isError": "yes"}},
        {"jsonrpc": "2.0", "id": "req-1", "result": {"content": [], "structuredContent": [1]}},
    ],
)
def test_protocol_faults_are_terminal_wire_errors(response: dict[str, Any]) -> None:
    result = normalise(response)
    assert isinstance(result, FailedTerminal)
    assert result.error.code == "mcp_wire_error"
    assert result.error.details == ()  # the server's message goes to the trace, not the model


def test_unknown_tool_error_code_is_a_terminal_execution_failure() -> None:
    result = normalise(failure("database exploded", errorCode="db_down"))
    assert isinstance(result, FailedTerminal)
    assert result.error.code == "mcp_tool_execution_failed"
    assert [d.message for d in result.error.details] == ["database exploded"]
    assert normalise(failure("no structured content")).error.code == "mcp_tool_execution_failed"  # type: ignore[union-attr]


@pytest.mark.parametrize("retry_after", [None, -5, "500", True, 10**12])
def test_a_bad_retry_hint_is_dropped(retry_after: object) -> None:
    result = normalise(failure("busy", errorCode="upstream_unavailable", retryAfterMs=retry_after))
    assert isinstance(result, FailedRetryable)
    assert result.error.retry_after_ms is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("token=abc; next", "token=[redacted]; next"),
        ("PASSWORD: hunter2 and more", "PASSWORD: [redacted] and more"),
        ("api_key=sk-123,user=bob", "api_key=[redacted],user=bob"),
        ('secret="a b c" done', "secret=[redacted] done"),
        ("Authorization: Bearer abc.def", "Authorization: [redacted]"),
        ("call with Bearer eyJhbGciOi.x now", "call with Bearer [redacted] now"),
        ("failed; stack=at x (a.js:1:2); retry", "failed; stack=[redacted]; retry"),
        ("boom\nTraceback (most recent call last):\n  File 'x.py'", "boom\n[stack trace redacted]"),
        # review findings: a quote between key and colon, a Basic credential, a URL password
        ('{"api_key": "sk-live-123"}', '{"api_key": [redacted]}'),
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: [redacted]"),
        (
            '{"authorization": "Basic x", "city": "Seoul"}',
            '{"authorization": [redacted], "city": "Seoul"}',
        ),
        ("postgres://admin:s3cret@db/x", "postgres://[redacted]@db/x"),
        # the reference fixture's two cases
        ("city is required; token=weather-secret", "city is required; token=[redacted]"),
        (
            "weather upstream timed out; stack=internal.ts:42",
            "weather upstream timed out; stack=[redacted]",
        ),
    ],
)
def test_sanitise_redacts_secrets_and_stacks(text: str, expected: str) -> None:
    notes: list[str] = []
    assert sanitise(text, notes) == expected
    assert notes  # every case redacts something, and the trace hears of it


def test_sanitise_keeps_safe_detail_untouched() -> None:
    text = "city must be one of Seoul, Busan; got 'Tokyo'"
    notes: list[str] = []
    assert sanitise(text, notes) == text
    assert notes == []


def test_details_are_capped() -> None:
    response = failure("x" * 1000)
    response["result"]["content"] += [{"type": "text", "text": "more"}] * 20 + [
        {"type": "image", "data": "..."}
    ]
    result = normalise(response)
    assert len(result.error.details) == 8  # type: ignore[union-attr]
    assert len(result.error.details[0].message or "") == 240  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("response_id", "request_id"), [("1", 1), (1, "1"), (True, 1), (1.0, 1), (None, "req-1")]
)
def test_ids_must_match_exactly(response_id: object, request_id: str | int) -> None:
    with pytest.raises(AdapterError) as caught:
        normalise({"jsonrpc": "2.0", "id": response_id, "result": {"content": []}}, request_id)
    assert caught.value.code == "mcp_response_id_mismatch"


def test_numeric_ids_match() -> None:
    assert isinstance(
        normalise({"jsonrpc": "2.0", "id": 17, "result": {"content": []}}, 17), Succeeded
    )


@pytest.mark.parametrize("response", [None, [], "not json", 3])
def test_a_response_that_is_no_message_is_refused(response: object) -> None:
    with pytest.raises(AdapterError) as caught:
        normalise(response)
    assert caught.value.code == "mcp_wire_error"
