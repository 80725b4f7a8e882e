"""OpenAI Agents SDK: callgate's tools as an agent's function tools, every invocation run
through callgate (``pip install 'callgate[openai-agents]'``).

    gate = AgentsGate(producer, context)  # an AsyncProducer; the server-trusted CallContext
    agent = Agent(name="support", model=model, tools=gate.tools, hooks=gate.hooks)
    result = await Runner.run(agent, "Refund 12,000 KRW on order O-17")

``gate.tools`` are the registry's tools the context's roles may use. ``gate.hooks`` submits
every function call of a model response as one callgate turn as soon as the response arrives
(reads at once, writes one at a time in proposal order); each tool invocation then waits for
its own call's result, and the model sees callgate's safe result or coded failure. Without the
hooks each invocation is submitted on its own, as a turn of one call.

A call the gate parks for approval becomes the SDK's interruption: ``result.interruptions``
names it, ``gate.parked[call_id]`` holds callgate's approval id and the impact the server
computed. Another person of the tenant approves it in callgate (``callgate approvals approve``);
then approve the interruption (``state.approve(item)``) and run the state again: the tool
returns the call's result. Approving in the SDK alone grants nothing: the tool then reports
``approval_required`` while callgate's request is pending. Rejecting in the SDK does not deny
callgate's request either; an approver does that (``callgate approvals deny``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from callgate.core.types import CallContext
from callgate.producer.async_producer import AsyncProducer
from callgate.producer.frameworks import relay
from callgate.producer.frameworks.relay import Parked, TurnRelay

relay.require("agents", "openai-agents", __name__)

from agents import Agent, AgentHooks, FunctionTool, RunContextWrapper  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall  # noqa: E402

__all__ = ["AgentsGate"]


class AgentsGate:
    """callgate's registry as Agents SDK function tools for one principal.

    Make one per request: ``context`` is that request's server-trusted ``CallContext`` (from
    your session, never from the model), ``producer`` an ``AsyncProducer`` made on the
    running event loop. ``timeout`` bounds each wait for a call's result, in seconds.
    """

    def __init__(
        self,
        producer: AsyncProducer,
        context: CallContext | Mapping[str, Any],
        *,
        timeout: float = relay.DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.relay = TurnRelay(producer, context, timeout=timeout)
        self.parked: dict[str, Parked] = {}
        self.tools: list[FunctionTool] = [self._function_tool(d) for d in self.relay.definitions()]
        self._names = frozenset(t.name for t in self.tools)
        self.hooks: AgentHooks[Any] = _SubmitResponse(self)

    async def submit_response(self, response: ModelResponse) -> None:
        """Submit the response's calls of these tools as one callgate turn. ``gate.hooks``
        calls this from ``on_llm_end``; call it from your own hooks if the agent has some."""
        calls = [
            (item.call_id, item.name, item.arguments)
            for item in response.output
            if isinstance(item, ResponseFunctionToolCall) and item.name in self._names
        ]
        if calls:
            await self.relay.submit(relay.proposals(calls))

    def _function_tool(self, definition: Mapping[str, Any]) -> FunctionTool:
        name = str(definition["name"])

        async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
            await self._ensure_submitted(ctx.tool_call_id, name, arguments)
            outcome = await self.relay.outcome(ctx.tool_call_id)
            if isinstance(outcome, Parked):
                self.parked[outcome.call_id] = outcome
            else:
                self.parked.pop(ctx.tool_call_id, None)
            return relay.body_text(outcome)

        async def needs_approval(
            ctx: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
        ) -> bool:
            await self._ensure_submitted(call_id, name, json.dumps(arguments))
            outcome = await self.relay.outcome(call_id)
            if isinstance(outcome, Parked):
                self.parked[call_id] = outcome
                return True
            return False

        return FunctionTool(
            name=name,
            description=str(definition["description"]),
            params_json_schema=dict(definition["parameters"]),
            on_invoke_tool=invoke,
            # The gate checks arguments against the tool's own schema; strict mode would
            # make every field required and reject the schemas' defaults.
            strict_json_schema=False,
            needs_approval=needs_approval,
        )

    async def _ensure_submitted(self, call_id: str, name: str, arguments: str) -> None:
        if not self.relay.submitted(call_id):
            await self.relay.submit(relay.proposals([(call_id, name, arguments)]))


class _SubmitResponse(AgentHooks[Any]):
    """Agent hooks that submit a model response's calls as one turn when it arrives."""

    def __init__(self, gate: AgentsGate) -> None:
        self.gate = gate

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        await self.gate.submit_response(response)
