"""LangGraph through callgate: a fake chat model proposes, a CallgateToolNode runs the calls
on real workers.

No network: ``FakeMessagesListChatModel`` answers with the scripted ``AIMessage``s in turn.
The graph is the usual agent loop: model → tools (while the model asks for tools) → model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command
from sqlalchemy import Engine

from callgate import AsyncProducer
from callgate.core.errors import CallgateError
from callgate.ops.stack import Stack
from callgate.producer.frameworks import relay
from callgate.producer.frameworks.langgraph import CallgateToolNode
from tests.acceptance.conftest import scalar
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


def proposing(*calls: tuple[str, str, dict[str, Any]], invalid: list[Any] | None = None) -> Any:
    """A fake model that proposes ``calls`` in one message, then says it is done."""
    return FakeMessagesListChatModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[
                    {"id": c, "name": n, "args": a, "type": "tool_call"} for c, n, a in calls
                ],
                invalid_tool_calls=invalid or [],
            ),
            AIMessage(content="done"),
        ]
    )


def agent_graph(model: Any, tools: CallgateToolNode) -> CompiledStateGraph[Any, Any, Any, Any]:
    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())


def thread(name: str, **configurable: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": name, **configurable}}


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def body(message: ToolMessage) -> dict[str, Any]:
    return dict(json.loads(str(message.content)))


def test_one_message_with_two_reads_and_a_write_is_one_turn_joined_by_call_id(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack()
    context = support_context()
    model = proposing(
        ("c-w", "get_weather", {"city": "Seoul", "unit": "celsius"}),
        ("c-r", "refund_payment", REFUND),
        ("c-s", "get_stock", {"symbol": "NVDA"}),
    )

    async def run(producer: AsyncProducer) -> dict[str, Any]:
        graph = agent_graph(model, CallgateToolNode(producer, context, timeout=30))
        return await graph.ainvoke({"messages": [HumanMessage("help")]}, thread("t1"))

    state = in_loop(run)
    replies = tool_messages(state)
    assert [m.tool_call_id for m in replies] == ["c-w", "c-r", "c-s"]  # proposal order
    assert [m.name for m in replies] == ["get_weather", "refund_payment", "get_stock"]
    assert all(m.status == "success" for m in replies)
    assert body(replies[1])["data"]["content"]["amount"] == 12000
    assert body(replies[1])["data"]["trust"] == "untrusted_tool_output"
    assert state["messages"][-1].content == "done"
    assert turns_of(engine, context["request_id"]) == 1
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 1


def test_refusals_reach_the_model_as_coded_errors(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    # user-5 is a viewer: refund_payment is not on its allowlist. The context comes from
    # the run's config, as an application that compiles its graph once would pass it.
    viewer = {**support_context(), "user_id": "user-5", "roles": ["viewer"]}
    model = proposing(
        ("c-r", "refund_payment", REFUND),
        invalid=[{"id": "c-bad", "name": "get_stock", "args": '{"symbol": ', "error": "cut"}],
    )

    async def run(producer: AsyncProducer) -> dict[str, Any]:
        tools = CallgateToolNode(producer, timeout=30)
        assert "refund_payment" not in {t["function"]["name"] for t in tools.tool_schemas(viewer)}
        graph = agent_graph(model, tools)
        config = thread("t2", callgate_context=viewer)
        return await graph.ainvoke({"messages": [HumanMessage("refund")]}, config)

    state = in_loop(run)
    refused = {m.tool_call_id: (m.status, body(m)) for m in tool_messages(state)}
    assert refused["c-r"][0] == "error"
    assert refused["c-r"][1]["error"]["code"] == "tool_not_allowed"
    assert refused["c-r"][1]["trust"] == "untrusted_tool_output"
    assert refused["c-bad"][1]["error"]["code"] == "invalid_arguments_json"
    assert effects_of_tool(engine, viewer["request_id"], "refund_payment") == 0


def test_a_parked_call_interrupts_the_graph_until_a_colleague_approves(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    context = support_context()
    model = proposing(
        ("c-w", "get_weather", {"city": "Seoul", "unit": "celsius"}),
        ("c-del", "delete_emails", {"query": "policy update"}),
    )
    config = thread("t3")

    async def run(producer: AsyncProducer) -> tuple[Any, Any, dict[str, Any]]:
        graph = agent_graph(model, CallgateToolNode(producer, context, timeout=30))
        first = await graph.ainvoke({"messages": [HumanMessage("clean up")]}, config)
        (asked,) = first["__interrupt__"]
        # Resumed before anyone approved in callgate: it interrupts again, nothing deleted.
        early = await graph.ainvoke(Command(resume="go"), config)
        assert effects_of_tool(engine, context["request_id"], "delete_emails") == 0
        (approval,) = asked.value["callgate_approvals"]
        # The first run's call and the early resume's call wait on the one request: one
        # approval releases both, and their one operation deletes once.
        assert approve(producer, approval["approval_id"]) == 2
        final = await graph.ainvoke(Command(resume="approved"), config)
        return asked.value, early, final

    asked, early, final = in_loop(run)
    (approval,) = asked["callgate_approvals"]
    assert (approval["call_id"], approval["tool_name"]) == ("c-del", "delete_emails")
    assert approval["impact"]["count"] == 50
    assert "__interrupt__" in early
    replies = {m.tool_call_id: m for m in tool_messages(final)}
    assert replies["c-del"].status == "success"
    assert len(body(replies["c-del"])["data"]["content"]["deleted"]) == 50
    assert replies["c-w"].status == "success"
    assert final["messages"][-1].content == "done"
    assert effects_of_tool(engine, context["request_id"], "delete_emails") == 50
    # Each run of the node was a turn; the weather read ran once, its result reused.
    assert turns_of(engine, context["request_id"]) == 3
    # (A read takes no reservation: each run is a call whose audit does not say "reused".)
    assert (
        scalar(
            engine,
            "SELECT count(*) FROM callgate.calls c JOIN callgate.turns t USING (turn_id)"
            " WHERE t.request_id = :r AND c.call_id = 'c-w' AND c.audit IS NOT NULL"
            " AND c.audit #>> '{verdicts,idempotency}' IS DISTINCT FROM 'reused'",
            r=context["request_id"],
        )
        == 1
    )


def test_a_worker_killed_in_the_crash_gap_still_ends_with_one_refund(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    s = fw_stack(workers=1, **CRASH_GAP)
    context = support_context()
    model = proposing(("c-r", "refund_payment", REFUND))

    async def run(producer: AsyncProducer) -> dict[str, Any]:
        graph = agent_graph(model, CallgateToolNode(producer, context, timeout=60))
        graph_run = asyncio.create_task(
            graph.ainvoke({"messages": [HumanMessage("refund")]}, thread("t4"))
        )
        await kill_in_crash_gap(s, engine, context["request_id"])
        return await graph_run

    state = in_loop(run)
    (reply,) = tool_messages(state)
    assert (reply.status, body(reply)["status"]) == ("success", "succeeded")
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 1


def test_bad_input_is_refused_with_stable_codes(in_loop: Callable[..., Any]) -> None:
    async def run(producer: AsyncProducer) -> list[str]:
        codes: list[str] = []
        no_context = CallgateToolNode(producer)
        bound = CallgateToolNode(producer, support_context())
        ai = AIMessage(content="", tool_calls=[{"id": "c", "name": "get_stock", "args": {}}])
        attempts = [
            lambda: no_context.ainvoke({"messages": [ai]}),  # no CallContext anywhere
            lambda: bound.ainvoke({"messages": [HumanMessage("hi")]}),  # not an AIMessage
            lambda: bound.ainvoke({"messages": []}),
        ]
        for attempt in attempts:
            try:
                await attempt()
            except CallgateError as exc:
                codes.append(str(exc.code))
        for bad in (
            lambda: CallgateToolNode(producer, {"tenant_id": "t"}),
            lambda: CallgateToolNode(producer, support_context(), timeout=float("nan")),
        ):
            try:
                bad()
            except CallgateError as exc:
                codes.append(str(exc.code))
        return codes

    assert in_loop(run) == ["invalid_input"] * 5
    try:
        relay.require("callgate_no_such_framework", "langgraph", "an integration")
    except CallgateError as exc:
        assert exc.code == "invalid_configuration"
        assert "callgate[langgraph]" in exc.message
    else:
        raise AssertionError("a missing framework was not refused")
