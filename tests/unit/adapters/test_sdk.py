"""Against the official SDKs' own types, when they are installed (the ``sdk`` extra).

Outbound: every result message and tool definition validates as the SDK's request param type,
and validation keeps every field (pydantic drops keys a TypedDict does not declare, so
"validated == sent" also proves no field is misplaced). Inbound: the SDKs' response objects
read exactly like the parsed JSON they came from.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from callgate.core.types import (
    AppError,
    FailedRetryable,
    FailedTerminal,
    ProposedCall,
    SafeErrorDetail,
    Succeeded,
)
from callgate.producer.adapters import (
    AdapterError,
    read_proposals,
    read_stream,
    tool_definitions,
    write_results,
)

from .support import inbound, load

PROPOSALS = [
    ProposedCall(call_id="call-weather", tool_name="get_weather", arguments={"city": "Seoul"}),
    ProposedCall(call_id="call-stock", tool_name="get_stock", arguments={"symbol": "ACME"}),
    ProposedCall(call_id="call-refund", tool_name="billing.refund", arguments={"order": "o-1"}),
]
KNOWN = {p.tool_name for p in PROPOSALS}
RESULTS: list[Succeeded | FailedRetryable | FailedTerminal] = [
    FailedTerminal(
        call_id="call-refund",
        tool_name="billing.refund",
        error=AppError(
            code="invalid_arguments", details=(SafeErrorDetail(code="required", path="/amount"),)
        ),
    ),
    FailedRetryable(
        call_id="call-stock",
        tool_name="get_stock",
        error=AppError(code="upstream_unavailable", retry_after_ms=500),
    ),
    Succeeded(call_id="call-weather", tool_name="get_weather", data={"temperature": 22}),
]
TOOLS = [
    {
        "name": p.tool_name,
        "description": f"{p.tool_name} tool",
        "parameters": {"type": "object", "properties": {}},
    }
    for p in PROPOSALS
]


def same_after_validation(adapter: TypeAdapter[Any], item: Any) -> None:
    assert adapter.validate_python(item) == item


# --- OpenAI ---------------------------------------------------------------------------------


def test_openai_chat_outbound_matches_the_sdk_params() -> None:
    pytest.importorskip("openai")
    from openai.types.chat import (
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageParam,
        ChatCompletionToolMessageParam,
    )

    messages = write_results("openai-chat", PROPOSALS, RESULTS)
    assert isinstance(messages, list)
    for message in messages:
        same_after_validation(TypeAdapter(ChatCompletionToolMessageParam), message)
        same_after_validation(TypeAdapter(ChatCompletionMessageParam), message)
    for tool in tool_definitions("openai-chat", TOOLS):
        same_after_validation(TypeAdapter(ChatCompletionFunctionToolParam), tool)


def test_openai_responses_outbound_matches_the_sdk_params() -> None:
    pytest.importorskip("openai")
    from openai.types.responses import FunctionToolParam, ResponseInputItemParam
    from openai.types.responses.response_input_item_param import FunctionCallOutput

    items = write_results("openai-responses", PROPOSALS, RESULTS)
    assert isinstance(items, list)
    for item in items:
        same_after_validation(TypeAdapter(FunctionCallOutput), item)
        same_after_validation(TypeAdapter(ResponseInputItemParam), item)
    for tool in tool_definitions("openai-responses", TOOLS):
        same_after_validation(TypeAdapter(FunctionToolParam), tool)


def test_openai_sdk_objects_read_like_their_json() -> None:
    pytest.importorskip("openai")
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response

    tools = {"Query", "GetWeatherArgs", "get_stock_price", "get_weather"}
    for n in range(4):
        raw = load(f"openai_chat_recorded_{n}.json")
        sdk = ChatCompletion.model_validate(raw)
        assert read_proposals("openai-chat", sdk, tools) == read_proposals(
            "openai-chat", raw, tools
        )
        # The bare message has no finish_reason: refused unless the caller vouches for it.
        message = sdk.choices[0].message
        with pytest.raises(AdapterError) as caught:
            read_proposals("openai-chat", message, tools)
        assert caught.value.code == "invalid_provider_envelope"
        vouched = read_proposals("openai-chat", message, tools, allow_missing_stop_reason=True)
        assert vouched == read_proposals("openai-chat", raw, tools)
        events = load(f"openai_chat_stream_recorded_{n}.json")
        chunks = [ChatCompletionChunk.model_validate(event) for event in events]
        assert read_stream("openai-chat", chunks, tools) == read_stream(
            "openai-chat", events, tools
        )
    raw_response = {
        **inbound("openai-responses", PROPOSALS),
        "created_at": 1,
        "model": "gpt-5",
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    response = Response.model_validate(raw_response)
    assert read_proposals("openai-responses", response, KNOWN) == PROPOSALS


# --- Anthropic ------------------------------------------------------------------------------


def test_anthropic_outbound_matches_the_sdk_params() -> None:
    pytest.importorskip("anthropic")
    from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam

    message = write_results("anthropic-messages", PROPOSALS, RESULTS)
    assert isinstance(message, dict)
    # Keep the adapter referenced: iterating lazily validated content after the adapter is
    # garbage-collected panics inside pydantic-core.
    message_param = TypeAdapter(MessageParam)
    validated = message_param.validate_python(message)
    assert validated["role"] == "user"
    assert list(validated["content"]) == message["content"]  # content validates lazily
    for block in message["content"]:
        same_after_validation(TypeAdapter(ToolResultBlockParam), block)
    assert [b["is_error"] for b in message["content"]] == [True, True, False]
    for tool in tool_definitions("anthropic-messages", TOOLS):
        same_after_validation(TypeAdapter(ToolParam), tool)


def test_anthropic_sdk_objects_read_like_their_json() -> None:
    pytest.importorskip("anthropic")
    from anthropic.types import Message, RawMessageStreamEvent

    for exchange in load("anthropic_cassette_e075a6c2-de4d-4125-9709-f0e178058190.json"):
        raw = exchange["response_body"]
        message = Message.model_validate(raw)
        assert read_proposals("anthropic-messages", message, {"get_weather"}) == read_proposals(
            "anthropic-messages", raw, {"get_weather"}
        )
    events = load("anthropic_stream_tool_use_response.json")
    sdk_events = [  # the SDK's event union has no ping; its stream drops them before we see them
        TypeAdapter(RawMessageStreamEvent).validate_python(event)
        for event in events
        if event["type"] != "ping"
    ]
    assert read_stream("anthropic-messages", sdk_events, {"get_weather"}) == read_stream(
        "anthropic-messages", events, {"get_weather"}
    )


# --- Gemini ---------------------------------------------------------------------------------


def test_gemini_generate_content_outbound_matches_the_sdk_types() -> None:
    types = pytest.importorskip("google.genai.types")
    content = write_results("gemini-generate-content", PROPOSALS, RESULTS)
    parsed = types.Content.model_validate(content)  # the SDK forbids unknown fields
    assert parsed.role == "user"
    responses = [part.function_response for part in parsed.parts]
    assert [(r.id, r.name) for r in responses] == [
        ("call-refund", "billing.refund"),
        ("call-stock", "get_stock"),
        ("call-weather", "get_weather"),
    ]
    assert responses[0].response == {
        "status": "failed_terminal",
        "error": {
            "code": "invalid_arguments",
            "details": [{"code": "required", "path": "/amount"}],
        },
        "trust": "untrusted_tool_output",
    }
    (tool,) = tool_definitions("gemini-generate-content", TOOLS)
    declarations = types.Tool.model_validate(tool).function_declarations
    assert [d.name for d in declarations] == ["get_weather", "get_stock", "billing.refund"]
    assert declarations[0].parameters_json_schema == {"type": "object", "properties": {}}


@pytest.mark.parametrize("with_ids", [True, False])
def test_gemini_generate_content_sdk_objects_read_like_their_json(with_ids: bool) -> None:
    types = pytest.importorskip("google.genai.types")
    raw = inbound("gemini-generate-content", PROPOSALS, with_ids=with_ids)
    sdk = types.GenerateContentResponse.model_validate(raw)
    assert read_proposals("gemini-generate-content", sdk, KNOWN) == read_proposals(
        "gemini-generate-content", raw, KNOWN
    )
    # the snake_case a plain model_dump() gives reads the same
    snake = sdk.model_dump(mode="json", exclude_none=True)
    assert read_proposals("gemini-generate-content", snake, KNOWN) == read_proposals(
        "gemini-generate-content", raw, KNOWN
    )


def _interactions() -> Any:
    genai = pytest.importorskip("google.genai")
    module = getattr(genai, "interactions", None)
    if module is None or not hasattr(module, "FunctionResultStep"):
        pytest.skip("this google-genai has no Interactions types")
    return module


def test_gemini_interactions_outbound_matches_the_sdk_types() -> None:
    gi = _interactions()
    message = write_results("gemini-interactions", PROPOSALS, RESULTS)
    assert isinstance(message, dict) and list(message) == ["input"]
    steps = TypeAdapter(list[gi.Step]).validate_python(message["input"])  # type: ignore[name-defined]
    for step, item in zip(steps, message["input"], strict=True):
        assert isinstance(step, gi.FunctionResultStep)
        assert step.model_dump(mode="json", exclude_none=True) == item
    for tool in tool_definitions("gemini-interactions", TOOLS):
        assert gi.Function.model_validate(tool).model_dump(mode="json", exclude_none=True) == tool


def test_gemini_interactions_sdk_objects_read_like_their_json() -> None:
    gi = _interactions()
    raw = inbound("gemini-interactions", PROPOSALS)
    interaction = gi.Interaction.model_validate(raw)
    assert read_proposals("gemini-interactions", interaction, KNOWN) == PROPOSALS
