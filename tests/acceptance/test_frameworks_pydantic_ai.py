"""pydantic-ai through callgate: its FunctionModel proposes, real workers run.

No network: ``FunctionModel`` answers each model request from a function of the messages
so far, so a test both scripts the calls and reads the tool results callgate produced."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import Engine

from callgate import AsyncProducer
from callgate.ops.stack import Stack
from callgate.producer.frameworks.pydantic_ai import CallgateToolset
from tests.acceptance.frameworks_support import (
    CRASH_GAP,
    approve,
    database_url,
    effects_of_tool,
    fw_stack,
    in_loop,
    kill_in_crash_gap,
    support_context,
    turns_of,
)

__all__ = ["database_url", "fw_stack", "in_loop"]  # fixtures, for pytest

REFUND = {"order_id": "O-17", "amount": 12000, "currency": "KRW"}


def scripted(*calls: tuple[str, str, dict[str, Any]]) -> FunctionModel:
    """A model that proposes ``calls`` (call id, tool, arguments) in one response, then,
    once every call has an answer, says which call ids it saw succeed or fail."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        answered = tool_answers(messages)
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(
                parts=[ToolCallPart(tool, args, tool_call_id=cid) for cid, tool, args in calls]
            )
        return ModelResponse(parts=[TextPart(json.dumps(sorted(answered)))])

    return FunctionModel(respond)


def tool_answers(messages: list[ModelMessage]) -> dict[str, tuple[str, Any]]:
    """What the model was sent for each call: ("return", content) or ("failed", text)."""
    answers: dict[str, tuple[str, Any]] = {}
    for message in messages:
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                kind = "failed" if getattr(part, "outcome", "success") == "failed" else "return"
                answers[part.tool_call_id] = (kind, part.content)
            elif isinstance(part, RetryPromptPart) and part.tool_call_id:
                answers[part.tool_call_id] = ("failed", part.content)
    return answers


def as_json(content: Any) -> dict[str, Any]:
    return content if isinstance(content, dict) else json.loads(str(content))


def test_two_reads_and_a_write_run_as_one_turn_and_the_model_sees_safe_results(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack()
    context = support_context()
    model = scripted(
        ("c-w", "get_weather", {"city": "Seoul", "unit": "celsius"}),
        ("c-s", "get_stock", {"symbol": "NVDA"}),
        ("c-r", "refund_payment", REFUND),
    )

    async def run(producer: AsyncProducer) -> Any:
        agent = Agent(model, toolsets=[CallgateToolset(producer, context, timeout=30)])
        return await agent.run("help")

    result = in_loop(run)
    answers = tool_answers(result.all_messages())
    assert {k: kind for k, (kind, _) in answers.items()} == {
        "c-w": "return",
        "c-s": "return",
        "c-r": "return",
    }
    refund = as_json(answers["c-r"][1])
    assert refund["status"] == "succeeded"
    assert refund["data"]["trust"] == "untrusted_tool_output"
    assert refund["data"]["content"]["amount"] == 12000
    assert turns_of(engine, context["request_id"]) == 1
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 1


def test_a_refusal_reaches_the_model_as_a_coded_error(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    context = support_context()
    model = scripted(("c-r", "refund_payment", {**REFUND, "currency": "USD"}))

    async def run(producer: AsyncProducer) -> Any:
        agent = Agent(model, toolsets=[CallgateToolset(producer, context, timeout=30)])
        return await agent.run("refund")

    result = in_loop(run)
    kind, content = tool_answers(result.all_messages())["c-r"]
    assert kind == "failed"
    body = as_json(content)
    assert body["error"]["code"] == "currency_mismatch"
    assert body["trust"] == "untrusted_tool_output"
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 0


def test_a_parked_call_is_a_deferred_tool_call_resumed_after_a_colleague_approves(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    context = support_context()
    model = scripted(("c-del", "delete_emails", {"query": "policy update"}))

    async def run(producer: AsyncProducer) -> tuple[DeferredToolRequests, Any]:
        agent = Agent(
            model,
            toolsets=[CallgateToolset(producer, context, timeout=30)],
            output_type=[str, DeferredToolRequests],
        )
        first = await agent.run("clean up")
        requests = first.output
        assert isinstance(requests, DeferredToolRequests)
        assert effects_of_tool(engine, context["request_id"], "delete_emails") == 0
        # Approved in pydantic-ai but not yet in callgate: deferred again, nothing runs.
        early = await agent.run(
            message_history=first.all_messages(),
            deferred_tool_results=requests.build_results(approve_all=True),
        )
        assert isinstance(early.output, DeferredToolRequests)
        assert effects_of_tool(engine, context["request_id"], "delete_emails") == 0
        assert approve(producer, requests.metadata["c-del"]["approval_id"]) == 1
        # A new toolset (as another process would make): the same call id and request id
        # join the same operation, so the approved deletion is what the model gets.
        agent_again = Agent(model, toolsets=[CallgateToolset(producer, context, timeout=30)])
        second = await agent_again.run(
            message_history=early.all_messages(),
            deferred_tool_results=early.output.build_results(approve_all=True),
        )
        return requests, second

    requests, second = in_loop(run)
    assert [c.tool_call_id for c in requests.approvals] == ["c-del"]
    assert requests.metadata["c-del"]["impact"]["count"] == 50
    kind, content = tool_answers(second.all_messages())["c-del"]
    assert kind == "return"
    assert len(as_json(content)["data"]["content"]["deleted"]) == 50
    assert effects_of_tool(engine, context["request_id"], "delete_emails") == 50


def test_a_worker_killed_in_the_crash_gap_still_ends_with_one_refund(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    s = fw_stack(workers=1, **CRASH_GAP)
    context = support_context()
    model = scripted(("c-r", "refund_payment", REFUND))

    async def run(producer: AsyncProducer) -> Any:
        agent = Agent(model, toolsets=[CallgateToolset(producer, context, timeout=60)])
        agent_run = asyncio.create_task(agent.run("refund"))
        await kill_in_crash_gap(s, engine, context["request_id"])
        return await agent_run

    result = in_loop(run)
    kind, content = tool_answers(result.all_messages())["c-r"]
    assert (kind, as_json(content)["status"]) == ("return", "succeeded")
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 1


def test_a_success_and_a_failure_reach_the_model_in_the_same_shape(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    context = support_context()
    model = scripted(
        ("c-w", "get_weather", {"city": "Seoul", "unit": "celsius"}),
        ("c-r", "refund_payment", {**REFUND, "currency": "USD"}),
    )

    async def run(producer: AsyncProducer) -> Any:
        agent = Agent(model, toolsets=[CallgateToolset(producer, context, timeout=30)])
        return await agent.run("weather, then refund")

    answers = tool_answers(in_loop(run).all_messages())
    (ok_kind, ok_content), (failed_kind, failed_content) = answers["c-w"], answers["c-r"]
    assert (ok_kind, failed_kind) == ("return", "failed")
    # The same JSON text both ways, as the openai-agents and LangGraph integrations send.
    assert type(ok_content) is str and type(failed_content) is str
    ok, failed = json.loads(ok_content), json.loads(failed_content)
    assert ok["status"] == "succeeded" and ok["data"]["trust"] == "untrusted_tool_output"
    assert failed["error"]["code"] == "currency_mismatch"
    assert set(ok) >= {"status"} and set(failed) >= {"status", "error", "trust"}
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 0
