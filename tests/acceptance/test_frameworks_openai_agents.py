"""OpenAI Agents SDK through callgate: the SDK's scripted model proposes, real workers run.

No network: ``agents.testing.ScriptedModel`` answers every model call from its script, and
records what the model was sent (the tool outputs callgate produced)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.testing import ScriptedModel, assistant_message, function_call
from sqlalchemy import Engine

from callgate import AsyncProducer
from callgate.core.errors import InputError
from callgate.ops.stack import Stack
from callgate.producer.frameworks.openai_agents import AgentsGate
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
NO_TRACING = RunConfig(tracing_disabled=True)


def tool_outputs(model: ScriptedModel) -> dict[str, dict[str, Any]]:
    """The function_call_output items the model was sent, by call id, parsed."""
    outputs: dict[str, dict[str, Any]] = {}
    for call in model.calls:
        for item in call.input if isinstance(call.input, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                outputs[item["call_id"]] = json.loads(item["output"])
    return outputs


def agent_for(gate: AgentsGate, model: ScriptedModel) -> Agent[Any]:
    return Agent(name="support", model=model, tools=gate.tools, hooks=gate.hooks)


def test_two_reads_and_a_write_run_as_one_turn_and_the_model_sees_safe_results(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack()
    context = support_context()
    model = ScriptedModel(
        [
            [
                function_call("get_weather", {"city": "Seoul", "unit": "celsius"}, call_id="c-w"),
                function_call("get_stock", {"symbol": "NVDA"}, call_id="c-s"),
                function_call("refund_payment", REFUND, call_id="c-r"),
            ],
            [assistant_message("Refunded 12,000 KRW; Seoul is mild.")],
        ]
    )

    async def run(producer: AsyncProducer) -> tuple[AgentsGate, Any]:
        gate = AgentsGate(producer, context, timeout=30)
        result = await Runner.run(agent_for(gate, model), "help", run_config=NO_TRACING)
        return gate, result

    gate, result = in_loop(run)
    assert result.final_output == "Refunded 12,000 KRW; Seoul is mild."
    outputs = tool_outputs(model)
    assert {k: v["status"] for k, v in outputs.items()} == {
        "c-w": "succeeded",
        "c-s": "succeeded",
        "c-r": "succeeded",
    }
    assert outputs["c-r"]["data"]["trust"] == "untrusted_tool_output"
    assert outputs["c-r"]["data"]["content"]["amount"] == 12000
    assert turns_of(engine, context["request_id"]) == 1  # one model response, one turn
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 1
    # The agent was shown the support role's allowlist, named as callgate names them.
    assert sorted(t.name for t in gate.tools) == sorted(d["name"] for d in gate.relay.definitions())


def test_a_refusal_reaches_the_model_as_a_coded_error(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    context = support_context()
    too_much = {**REFUND, "amount": 12001}
    model = ScriptedModel(
        [
            [function_call("refund_payment", too_much, call_id="c-r")],
            [assistant_message("I cannot refund that much.")],
        ]
    )

    async def run(producer: AsyncProducer) -> Any:
        gate = AgentsGate(producer, context, timeout=30)
        return await Runner.run(agent_for(gate, model), "refund", run_config=NO_TRACING)

    in_loop(run)
    output = tool_outputs(model)["c-r"]
    assert output["status"] == "failed_terminal"
    assert output["error"]["code"] == "refund_amount_exceeded"
    assert output["trust"] == "untrusted_tool_output"
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 0


def test_an_approval_interrupts_the_run_and_another_person_releases_it(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    fw_stack(workers=1)
    context = support_context()
    model = ScriptedModel(
        [
            [function_call("delete_emails", {"query": "policy update"}, call_id="c-del")],
            [assistant_message("Deleted the 50 policy e-mails.")],
        ]
    )

    async def run(producer: AsyncProducer) -> tuple[Any, Any, dict[str, Any]]:
        gate = AgentsGate(producer, context, timeout=30)
        agent = agent_for(gate, model)
        first = await Runner.run(agent, "clean up", run_config=NO_TRACING)
        (item,) = first.interruptions
        parked = gate.parked[item.call_id]
        assert effects_of_tool(engine, context["request_id"], "delete_emails") == 0
        # The requester cannot approve their own request; a colleague can.
        with pytest.raises(Exception, match="approval_forbidden"):
            approve(producer, parked.approval_id, by="user-17")
        assert approve(producer, parked.approval_id) == 1
        state = first.to_state()
        state.approve(item)
        again = await Runner.run(agent, state, run_config=NO_TRACING)
        return parked, again, tool_outputs(model)

    parked, again, outputs = in_loop(run)
    assert parked.impact["count"] == 50
    assert again.final_output == "Deleted the 50 policy e-mails."
    assert outputs["c-del"]["status"] == "succeeded"
    assert len(outputs["c-del"]["data"]["content"]["deleted"]) == 50
    assert effects_of_tool(engine, context["request_id"], "delete_emails") == 50


def test_a_worker_killed_in_the_crash_gap_still_ends_with_one_refund(
    in_loop: Callable[..., Any], fw_stack: Callable[..., Stack], engine: Engine
) -> None:
    s = fw_stack(workers=1, **CRASH_GAP)
    context = support_context()
    model = ScriptedModel(
        [
            [function_call("refund_payment", REFUND, call_id="c-r")],
            [assistant_message("Refunded.")],
        ]
    )

    async def run(producer: AsyncProducer) -> Any:
        gate = AgentsGate(producer, context, timeout=60)
        agent_run = asyncio.create_task(
            Runner.run(agent_for(gate, model), "refund", run_config=NO_TRACING)
        )
        await kill_in_crash_gap(s, engine, context["request_id"])
        return await agent_run

    result = in_loop(run)
    assert result.final_output == "Refunded."
    assert tool_outputs(model)["c-r"]["status"] == "succeeded"
    assert effects_of_tool(engine, context["request_id"], "refund_payment") == 1


def test_a_context_that_is_not_a_call_context_is_refused(
    in_loop: Callable[..., Any],
) -> None:
    async def run(producer: AsyncProducer) -> None:
        AgentsGate(producer, {"tenant_id": "tenant-a"})

    with pytest.raises(InputError) as refused:
        in_loop(run)
    assert refused.value.code == "invalid_input"
