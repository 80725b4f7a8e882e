"""Real payloads recorded by the official SDKs' test suites read correctly.

Expectations are derived from each recording independently of the adapters (plus the ids and
names written out by hand for the streams), and the Anthropic cassettes' own follow-up
requests show which ``tool_result`` blocks the provider accepted for each call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from callgate.core.types import AppError, FailedTerminal, ProposedCall, Succeeded
from callgate.producer.adapters import AdapterError, read_proposals, read_stream, write_results

from .support import load, recordings_dir

OPENAI_TOOLS = {"Query", "GetWeatherArgs", "get_stock_price", "get_weather"}


def names(pattern: str) -> list[str]:
    found = sorted(path.name for path in recordings_dir().glob(pattern))
    assert found, f"no recordings match {pattern} in {recordings_dir()}"
    return found


def expected_chat(completion: dict[str, Any]) -> list[ProposedCall]:
    calls = completion["choices"][0]["message"]["tool_calls"]
    return [
        ProposedCall(
            call_id=c["id"],
            tool_name=c["function"]["name"],
            arguments=json.loads(c["function"]["arguments"]),
        )
        for c in calls
    ]


@pytest.mark.parametrize("name", names("openai_chat_recorded_*.json"))
def test_openai_chat_recordings(name: str) -> None:
    completion = load(name)
    proposals = read_proposals("openai-chat", completion, OPENAI_TOOLS)
    assert proposals == expected_chat(completion)
    assert proposals  # every recording proposes at least one call


def test_the_parallel_openai_recording_keeps_both_calls_in_order() -> None:
    proposals = read_proposals("openai-chat", load("openai_chat_recorded_2.json"), OPENAI_TOOLS)
    assert [(p.call_id, p.tool_name) for p in proposals] == [
        ("call_fdNz3vOBKYgOIpMdWotB9MjY", "GetWeatherArgs"),
        ("call_h1DWI1POMJLb0KwIyQHWXD4p", "get_stock_price"),
    ]


STREAMS = {
    "openai_chat_stream_recorded_0.json": [
        ("call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather", {"city": "New York City"})
    ],
    "openai_chat_stream_recorded_1.json": [
        ("call_CTf1nWJLqSeRgDqaCG27xZ74", "get_weather", {"city": "San Francisco", "state": "CA"})
    ],
    "openai_chat_stream_recorded_2.json": [
        (
            "call_c91SqDXlYFuETYv8mUHzz6pp",
            "GetWeatherArgs",
            {"city": "Edinburgh", "country": "UK", "units": "c"},
        )
    ],
    "openai_chat_stream_recorded_3.json": [
        (
            "call_JMW1whyEaYG438VE1OIflxA2",
            "GetWeatherArgs",
            {"city": "Edinburgh", "country": "GB", "units": "c"},
        ),
        (
            "call_DNYTawLBoN8fj3KN6qU9N1Ou",
            "get_stock_price",
            {"ticker": "AAPL", "exchange": "NASDAQ"},
        ),
    ],
}


def test_every_openai_stream_recording_is_covered() -> None:
    assert sorted(STREAMS) == names("openai_chat_stream_recorded_*.json")


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_openai_chat_stream_recordings_reassemble(name: str) -> None:
    proposals = read_stream("openai-chat", load(name), OPENAI_TOOLS)
    assert [(p.call_id, p.tool_name, p.arguments) for p in proposals] == STREAMS[name]


def test_anthropic_stream_recording_reassembles() -> None:
    proposals = read_stream(
        "anthropic-messages", load("anthropic_stream_tool_use_response.json"), {"get_weather"}
    )
    assert proposals == [
        ProposedCall(
            call_id="toolu_01NRLabsLyVHZPKxbKvkfSMn",
            tool_name="get_weather",
            arguments={"location": "Paris"},
        )
    ]


def test_anthropic_stream_with_invalid_json_is_refused() -> None:
    events = load("anthropic_stream_tool_use_invalid_json_response.json")
    with pytest.raises(AdapterError) as caught:
        read_stream("anthropic-messages", events, {"get_weather"})
    assert caught.value.code == "invalid_arguments_json"


def exchanges() -> Iterator[tuple[str, int, dict[str, Any]]]:
    for name in names("anthropic_cassette_*.json"):
        for index, exchange in enumerate(load(name)):
            yield name, index, exchange


EXCHANGES = list(exchanges())
# Streamed exchanges kept no response body; their calls are checked through the requests below.
ANSWERED = [(n, i, e) for n, i, e in EXCHANGES if e["response_body"] is not None]


def tools_of(exchange: dict[str, Any]) -> set[str]:
    return {tool["name"] for tool in exchange["request_body"].get("tools", [])}


@pytest.mark.parametrize(
    "exchange", [e for _, _, e in ANSWERED], ids=[f"{n[19:27]}-{i}" for n, i, _ in ANSWERED]
)
def test_anthropic_cassette_responses(exchange: dict[str, Any]) -> None:
    response = exchange["response_body"]
    if response.get("type") == "error":
        with pytest.raises(AdapterError) as caught:
            read_proposals("anthropic-messages", response, tools_of(exchange))
        assert caught.value.code == "invalid_provider_envelope"
        return
    expected = [
        ProposedCall(call_id=b["id"], tool_name=b["name"], arguments=b["input"])
        for b in response["content"]
        if b["type"] == "tool_use"  # server_tool_use blocks are the provider's to run
    ]
    assert read_proposals("anthropic-messages", response, tools_of(exchange)) == expected
    assert bool(expected) == (response["stop_reason"] == "tool_use")


def conversation_turns() -> Iterator[tuple[str, dict[str, Any], dict[str, Any], set[str]]]:
    """(label, assistant message, next user message) pairs from the recorded requests."""
    for name, index, exchange in EXCHANGES:
        messages = exchange["request_body"]["messages"]
        for position in range(len(messages) - 1):
            assistant, user = messages[position], messages[position + 1]
            if assistant["role"] == "assistant" and isinstance(user["content"], list):
                yield f"{name[19:27]}-{index}-{position}", assistant, user, tools_of(exchange)


TURNS = list(conversation_turns())


def test_the_cassettes_hold_recorded_turns() -> None:
    assert len(TURNS) >= 8


@pytest.mark.parametrize(
    ("assistant", "user", "tools"), [t[1:] for t in TURNS], ids=[t[0] for t in TURNS]
)
def test_our_tool_results_answer_the_recorded_calls(
    assistant: dict[str, Any], user: dict[str, Any], tools: set[str]
) -> None:
    """The provider accepted the recorded tool_result blocks; ours carry the same ids and
    is_error flags, so the provider would accept them too."""
    # A message of the request's history keeps no stop_reason: built from a finished turn,
    # so it opts in to being read without one.
    proposals = read_proposals(
        "anthropic-messages",
        {"role": "assistant", "content": assistant["content"]},
        tools,
        allow_missing_stop_reason=True,
    )
    recorded = [b for b in user["content"] if b["type"] == "tool_result"]
    assert [p.call_id for p in proposals] == [b["tool_use_id"] for b in recorded]
    results: list[Succeeded | FailedTerminal] = [
        FailedTerminal(
            call_id=p.call_id, tool_name=p.tool_name, error=AppError(code="execution_failed")
        )
        if b.get("is_error")
        else Succeeded(call_id=p.call_id, tool_name=p.tool_name, data={"recorded": b["content"]})
        for p, b in zip(proposals, recorded, strict=True)
    ]
    message = write_results("anthropic-messages", proposals, results)
    assert isinstance(message, dict)
    assert message["role"] == user["role"] == "user"
    assert [(b["type"], b["tool_use_id"], b["is_error"]) for b in message["content"]] == [
        ("tool_result", b["tool_use_id"], bool(b.get("is_error"))) for b in recorded
    ]


def test_recordings_dir_can_be_overridden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CALLGATE_FIXTURES_DIR", str(tmp_path))
    assert recordings_dir() == tmp_path
