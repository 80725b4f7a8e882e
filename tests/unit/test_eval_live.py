"""``--live``: the conversation a live model is asked through its official SDK, over a mock
transport (no network): the request carries the fixture's text and the exposed tools in the
surface's shape, the results go back in the surface's own message, and the SDK's response is
what the adapter reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from callgate.ops.lab.eval.live import Conversation
from callgate.ops.lab.eval.suites.builtin.tools import registry
from callgate.producer import adapters

# The SDKs (the sdk extra) and the HTTP client they are built on.
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
httpx = pytest.importorskip("httpx2")

CHAT_CALL = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'},
                    }
                ],
            },
        }
    ],
}
CHAT_TEXT = {
    **CHAT_CALL,
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "서울은 -2°C입니다."},
        }
    ],
}


def _transport(answers: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Any:
    def handle(request: Any) -> Any:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=answers[len(seen) - 1])

    return httpx.MockTransport(handle)


def test_openai_chat_over_the_sdk_asks_with_the_tools_and_sends_the_results_back() -> None:
    seen: list[dict[str, Any]] = []
    client = openai.OpenAI(
        api_key="test", http_client=httpx.Client(transport=_transport([CHAT_CALL, CHAT_TEXT], seen))
    )
    tools = [registry().tools["get_weather"]]
    talk = Conversation("openai-chat", "gpt-test", client, tools)
    first = talk.ask("서울 날씨 알려줘")
    calls = adapters.read_proposals("openai-chat", first, {"get_weather"})
    assert [(c.tool_name, c.arguments) for c in calls] == [("get_weather", {"city": "Seoul"})]
    assert seen[0]["model"] == "gpt-test"
    assert seen[0]["messages"] == [{"role": "user", "content": "서울 날씨 알려줘"}]
    assert [t["function"]["name"] for t in seen[0]["tools"]] == ["get_weather"]
    results = adapters.write_results(
        "openai-chat",
        calls,
        [
            {
                "status": "succeeded",
                "call_id": "call_1",
                "tool_name": "get_weather",
                "data": {"t": -2},
            }
        ],
    )
    final = talk.answer_results(results)
    assert final["choices"][0]["message"]["content"] == "서울은 -2°C입니다."
    roles = [m["role"] for m in seen[1]["messages"]]
    assert roles == ["user", "assistant", "tool"]
    assert seen[1]["messages"][2]["tool_call_id"] == "call_1"


def test_anthropic_messages_over_the_sdk() -> None:
    reply = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "cancel_order",
                "input": {"order_id": "O-99"},
            }
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    seen: list[dict[str, Any]] = []
    client = anthropic.Anthropic(
        api_key="test", http_client=httpx.Client(transport=_transport([reply], seen))
    )
    talk = Conversation(
        "anthropic-messages", "claude-test", client, [registry().tools["cancel_order"]]
    )
    response = talk.ask("주문 O-99 취소해줘")
    calls = adapters.read_proposals("anthropic-messages", response, {"cancel_order"})
    assert [c.tool_name for c in calls] == ["cancel_order"]
    assert seen[0]["tools"][0]["name"] == "cancel_order" and "input_schema" in seen[0]["tools"][0]
    assert talk.messages[-1]["role"] == "assistant"
