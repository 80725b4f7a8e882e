"""The reference TypeScript fixture of the adapters' design, ported case by case (plus
openai-responses).

Envelopes are the fixture's own compact shapes, each stating its stop/finish reason or
status (a response without one is refused as possibly cut off). Its gate-decision rows
(mayExecute) test the gate, not the adapters; they are not repeated here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from callgate.core.errors import CorrelationError
from callgate.core.types import FailedRetryable, FailedTerminal, ProposedCall, Succeeded
from callgate.producer.adapters import SURFACES, AdapterError, read_proposals, write_results
from callgate.worker.mcp.results import normalise_result

from .support import id_status

KNOWN = {"get_weather", "get_stock", "get_news"}
PROPOSALS = [
    ProposedCall(
        call_id="call-weather",
        tool_name="get_weather",
        arguments={"city": "Seoul", "unit": "celsius"},
    ),
    ProposedCall(call_id="call-stock", tool_name="get_stock", arguments={"symbol": "ACME"}),
    ProposedCall(call_id="call-news", tool_name="get_news", arguments={"topic": "semiconductors"}),
]


def openai_item(call_id: str, name: str, args: object) -> dict[str, Any]:
    text = args if isinstance(args, str) else json.dumps(args)
    return {"id": call_id, "function": {"name": name, "arguments": text}}


INBOUND: list[tuple[str, dict[str, Any]]] = [
    (
        "openai-chat",
        {
            "finish_reason": "tool_calls",
            "message": {
                "tool_calls": [openai_item(c.call_id, c.tool_name, c.arguments) for c in PROPOSALS]
            },
        },
    ),
    (
        "openai-responses",
        {
            "object": "response",
            "status": "completed",
            "output": [{"type": "reasoning", "id": "rs_1", "summary": []}]
            + [
                {
                    "type": "function_call",
                    "id": f"fc_{c.call_id}",
                    "call_id": c.call_id,
                    "name": c.tool_name,
                    "arguments": json.dumps(c.arguments),
                }
                for c in PROPOSALS
            ],
        },
    ),
    (
        "anthropic-messages",
        {
            "stop_reason": "tool_use",
            "content": [{"type": "text", "text": "three reads"}]
            + [
                {"type": "tool_use", "id": c.call_id, "name": c.tool_name, "input": c.arguments}
                for c in PROPOSALS
            ],
        },
    ),
    (
        "gemini-generate-content",
        {
            "candidates": [
                {
                    "content": {
                        "parts": [
                            {
                                "functionCall": {
                                    "id": c.call_id,
                                    "name": c.tool_name,
                                    "args": c.arguments,
                                }
                            }
                            for c in PROPOSALS
                        ]
                    },
                    "finishReason": "STOP",
                }
            ]
        },
    ),
    (
        "gemini-interactions",
        {
            "id": "interaction-1",
            "status": "requires_action",
            "steps": [
                {
                    "type": "function_call",
                    "id": c.call_id,
                    "name": c.tool_name,
                    "arguments": c.arguments,
                }
                for c in PROPOSALS
            ],
        },
    ),
]


@pytest.mark.parametrize(("surface", "response"), INBOUND, ids=[s for s, _ in INBOUND])
def test_every_surface_converges_to_the_same_proposals(
    surface: str, response: dict[str, Any]
) -> None:
    assert read_proposals(surface, response, KNOWN) == PROPOSALS


def test_inbound_covers_every_surface() -> None:
    assert sorted(s for s, _ in INBOUND) == sorted(SURFACES)


def test_openai_final_answer_without_calls_is_empty() -> None:
    response = {"finish_reason": "stop", "message": {"content": "final answer"}}
    assert read_proposals("openai-chat", response, KNOWN) == []


INBOUND_NEGATIVES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "empty tool signal",
        "openai-chat",
        {"finish_reason": "tool_calls", "message": {"tool_calls": []}},
        "missing_tool_calls",
    ),
    (
        "malformed tool_calls",
        "openai-chat",
        {"finish_reason": "stop", "message": {"tool_calls": {}}},
        "malformed_tool_calls",
    ),
    (
        "partial arguments",
        "openai-chat",
        {
            "finish_reason": "tool_calls",
            "message": {"tool_calls": [openai_item("call-1", "get_weather", '{"city":')]},
        },
        "invalid_arguments_json",
    ),
    (
        "duplicate call id",
        "openai-chat",
        {
            "finish_reason": "tool_calls",
            "message": {
                "tool_calls": [
                    openai_item("same", "get_weather", {}),
                    openai_item("same", "get_stock", {}),
                ]
            },
        },
        "duplicate_call_id",
    ),
    (
        "missing tool block",
        "anthropic-messages",
        {"stop_reason": "tool_use", "content": [{"type": "text", "text": "dropped"}]},
        "missing_tool_calls",
    ),
    (
        "a name that is no canonical spelling",
        "openai-chat",
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "call-x",
                                "type": "function",
                                "function": {"name": "cg-bad-zz", "arguments": "{}"},
                            }
                        ],
                    },
                }
            ]
        },
        "unknown_tool",
    ),
]


@pytest.mark.parametrize(
    ("surface", "response", "code"),
    [row[1:] for row in INBOUND_NEGATIVES],
    ids=[row[0] for row in INBOUND_NEGATIVES],
)
def test_inbound_negatives_raise_their_code(
    surface: str, response: dict[str, Any], code: str
) -> None:
    with pytest.raises(AdapterError) as caught:
        read_proposals(surface, response, KNOWN)
    assert caught.value.code == code


RESULTS: list[dict[str, Any]] = [
    {
        "status": "failed_terminal",
        "call_id": "call-news",
        "tool_name": "get_news",
        "error": {"code": "source_not_found"},
    },
    {
        "status": "failed_retryable",
        "call_id": "call-stock",
        "tool_name": "get_stock",
        "error": {"code": "upstream_unavailable", "retry_after_ms": 500},
    },
    {
        "status": "succeeded",
        "call_id": "call-weather",
        "tool_name": "get_weather",
        "data": {"temperature": 22, "unit": "celsius"},
    },
]

CORRELATION_NEGATIVES: list[tuple[str, Callable[[], list[dict[str, Any]]], str]] = [
    (
        "non-terminal result",
        lambda: [*RESULTS[:2], {**RESULTS[2], "status": "started"}],
        "non_terminal_result",
    ),
    ("duplicate result", lambda: [RESULTS[0], RESULTS[0], *RESULTS[1:]], "duplicate_result"),
    ("missing result", lambda: RESULTS[1:], "missing_result"),
    (
        "extra result",
        lambda: [
            *RESULTS,
            {
                "status": "succeeded",
                "call_id": "call-extra",
                "tool_name": "get_weather",
                "data": {},
            },
        ],
        "extra_result",
    ),
    (
        "wrong tool",
        lambda: [*RESULTS[:2], {**RESULTS[2], "tool_name": "get_stock"}],
        "tool_name_mismatch",
    ),
]


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize(
    ("build", "code"),
    [row[1:] for row in CORRELATION_NEGATIVES],
    ids=[row[0] for row in CORRELATION_NEGATIVES],
)
def test_correlation_negatives_are_refused_before_serialising(
    surface: str, build: Callable[[], list[dict[str, Any]]], code: str
) -> None:
    with pytest.raises(AdapterError) as caught:
        write_results(surface, PROPOSALS, build())
    assert caught.value.code == code
    assert isinstance(caught.value, CorrelationError)  # the same family fan-in raises


@pytest.mark.parametrize("surface", SURFACES)
def test_each_id_keeps_its_own_status_on_every_surface(surface: str) -> None:
    wire = write_results(surface, PROPOSALS, RESULTS)
    expected = [(r["call_id"], r["status"]) for r in RESULTS]
    assert id_status(surface, wire) == expected


def test_gemini_results_name_their_tools_in_result_order() -> None:
    generate = write_results("gemini-generate-content", PROPOSALS, RESULTS)
    assert isinstance(generate, dict)
    names = [part["functionResponse"]["name"] for part in generate["parts"]]
    assert names == ["get_news", "get_stock", "get_weather"]
    interactions = write_results("gemini-interactions", PROPOSALS, RESULTS)
    assert isinstance(interactions, dict)
    assert [item["name"] for item in interactions["input"]] == [
        "get_news",
        "get_stock",
        "get_weather",
    ]


REQUEST_ID = "mcp-req-17"


def normalise(response: dict[str, Any]) -> Succeeded | FailedRetryable | FailedTerminal:
    return normalise_result(
        response, provider_call_id="call-weather", tool_name="get_weather", request_id=REQUEST_ID
    )


MCP_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "protocol invalid params",
        {
            "jsonrpc": "2.0",
            "id": "mcp-req-17",
            "error": {"code": -32602, "message": "Invalid params"},
        },
        {"status": "failed_terminal", "error": {"code": "mcp_invalid_params"}},
    ),
    (
        "fixable invalid arguments",
        {
            "jsonrpc": "2.0",
            "id": "mcp-req-17",
            "result": {
                "isError": True,
                "content": [{"type": "text", "text": "city is required; token=weather-secret"}],
                "structuredContent": {"errorCode": "invalid_arguments"},
            },
        },
        {
            "status": "failed_terminal",
            "error": {
                "code": "invalid_arguments",
                "details": [
                    {"code": "mcp_tool_detail", "message": "city is required; token=[redacted]"}
                ],
            },
        },
    ),
    (
        "transient upstream",
        {
            "jsonrpc": "2.0",
            "id": "mcp-req-17",
            "result": {
                "isError": True,
                "content": [
                    {"type": "text", "text": "weather upstream timed out; stack=internal.ts:42"}
                ],
                "structuredContent": {"errorCode": "upstream_unavailable", "retryAfterMs": 500},
            },
        },
        {
            "status": "failed_retryable",
            "error": {
                "code": "upstream_unavailable",
                "details": [
                    {
                        "code": "mcp_tool_detail",
                        "message": "weather upstream timed out; stack=[redacted]",
                    }
                ],
                "retry_after_ms": 500,
            },
        },
    ),
]


@pytest.mark.parametrize(
    ("response", "expected"), [c[1:] for c in MCP_CASES], ids=[c[0] for c in MCP_CASES]
)
def test_mcp_responses_are_classified(response: dict[str, Any], expected: dict[str, Any]) -> None:
    result = normalise(response)
    dumped = result.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    assert {"status": result.status, "error": dumped["error"]} == expected
    assert (result.call_id, result.tool_name) == ("call-weather", "get_weather")


def test_mcp_response_for_another_request_is_refused() -> None:
    with pytest.raises(AdapterError) as caught:
        normalise({"jsonrpc": "2.0", "id": "wrong-id", "result": {"content": []}})
    assert caught.value.code == "mcp_response_id_mismatch"


def test_mcp_success_is_rekeyed_to_the_provider_call_on_both_gemini_surfaces() -> None:
    success = normalise(
        {
            "jsonrpc": "2.0",
            "id": "mcp-req-17",
            "result": {"content": [{"type": "text", "text": "22 celsius"}]},
        }
    )
    assert isinstance(success, Succeeded)
    assert success.data == {"content": [{"type": "text", "text": "22 celsius"}]}
    generate = write_results("gemini-generate-content", [PROPOSALS[0]], [success])
    interactions = write_results("gemini-interactions", [PROPOSALS[0]], [success])
    assert isinstance(generate, dict) and isinstance(interactions, dict)
    generate_id = generate["parts"][0]["functionResponse"]["id"]
    interactions_id = interactions["input"][0]["call_id"]
    assert [REQUEST_ID, generate_id, interactions_id] == [
        "mcp-req-17",
        "call-weather",
        "call-weather",
    ]
