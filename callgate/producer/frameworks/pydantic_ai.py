"""pydantic-ai: a toolset whose calls run through callgate (extra ``callgate[pydantic-ai]``).

    toolset = CallgateToolset(producer, context)  # an AsyncProducer; the server-trusted context
    agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
    result = await agent.run("Refund 12,000 KRW on order O-17")

The toolset lists the registry's tools the context's roles may use. The first of a model
response's calls to reach the toolset submits all of the response's calls of these tools as
one callgate turn (reads at once, writes one at a time in proposal order); each call then
waits for its own result.

**One shape for every result.** The model receives callgate's result body as compact JSON
text (a ``str``) whether the call succeeded or not, the same text the openai-agents and
LangGraph integrations send: ``{"status": "succeeded", "data": {...}}`` for a success, and
``{"status", "error": {"code", ...}, "trust"}`` for a refusal or failure. A refusal or
failure is raised as pydantic-ai's ``ToolFailed`` (whose message is text only), so it keeps
pydantic-ai's failed outcome and the provider's native error channel; a success is returned
as that same text rather than a dict, so code reading ``ToolReturnPart.content`` parses one
shape for both.

A call the gate parks for approval surfaces as pydantic-ai's deferred tool call: the run ends
with ``DeferredToolRequests`` whose ``approvals`` holds it and whose ``metadata[call_id]``
holds callgate's ``approval_id`` and the server-computed ``impact``. Another person of the
tenant approves it in callgate (``callgate approvals approve``); then resume the run with
``deferred_tool_results=requests.build_results(approve_all=True)`` and the same history and
context: the tool returns the call's result. Approving in pydantic-ai alone grants nothing:
while callgate's request is pending the call is deferred again. ``ToolDenied`` only answers
the model; an approver denies callgate's request (``callgate approvals deny``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.core.errors import InputError
from callgate.core.types import CallContext
from callgate.producer.async_producer import AsyncProducer
from callgate.producer.frameworks import relay
from callgate.producer.frameworks.relay import Done, Parked, TurnRelay

relay.require("pydantic_ai", "pydantic-ai", __name__)

from pydantic_ai import ApprovalRequired, RunContext, ToolFailed  # noqa: E402
from pydantic_ai.messages import ModelResponse, ToolCallPart  # noqa: E402
from pydantic_ai.tools import ToolDefinition  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool  # noqa: E402
from pydantic_core import SchemaValidator, core_schema  # noqa: E402

__all__ = ["CallgateToolset"]

# The gate validates arguments against the tool's own schema (and says what is wrong with a
# stable code): pydantic-ai passes them on as the model wrote them.
_ANY_ARGUMENTS = SchemaValidator(schema=core_schema.dict_schema())


class CallgateToolset(AbstractToolset[Any]):
    """callgate's registry as a pydantic-ai toolset for one principal.

    Make one per request: ``context`` is the request's server-trusted ``CallContext`` (from
    your session, never from the model), ``producer`` an ``AsyncProducer`` made on the
    running event loop. ``timeout`` bounds each wait for a call's result, in seconds.
    """

    def __init__(
        self,
        producer: AsyncProducer,
        context: CallContext | Mapping[str, Any],
        *,
        timeout: float = relay.DEFAULT_TIMEOUT_SECONDS,
        id: str | None = None,
    ) -> None:
        self.relay = TurnRelay(producer, context, timeout=timeout)
        self._id = id
        self._definitions = {d["name"]: d for d in self.relay.definitions()}

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The tools the context's roles may use."""
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=ToolDefinition(
                    name=name,
                    description=str(definition["description"]),
                    parameters_json_schema=dict(definition["parameters"]),
                ),
                max_retries=0,
                args_validator=_ANY_ARGUMENTS,
            )
            for name, definition in self._definitions.items()
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        """Run one call through callgate: its safe result as JSON text, a coded ``ToolFailed``, or
        ``ApprovalRequired`` while it waits for a person."""
        call_id = ctx.tool_call_id
        if call_id is None:
            raise InputError(f"pydantic-ai called tool {name!r} without a tool call id")
        if not self.relay.submitted(call_id):
            await self.relay.submit(
                relay.proposals(self._response_calls(ctx, call_id, name, tool_args))
            )
        outcome = await self.relay.outcome(call_id)
        if isinstance(outcome, Parked):
            raise ApprovalRequired(metadata=outcome.metadata)
        if isinstance(outcome, Done) and outcome.ok:
            return relay.body_text(outcome)
        raise ToolFailed(relay.body_text(outcome))

    def _response_calls(
        self, ctx: RunContext[Any], call_id: str, name: str, tool_args: dict[str, Any]
    ) -> list[tuple[str, str, object]]:
        """The calls of this toolset in the model response this call belongs to, in the
        order the model proposed them; just this call when resuming or when the response
        is not at hand (a wrapper renamed the tools)."""
        this: list[tuple[str, str, object]] = [(call_id, name, tool_args)]
        if ctx.tool_call_approved or not ctx.messages:
            return this
        response = ctx.messages[-1]
        if not isinstance(response, ModelResponse):
            return this
        calls: list[tuple[str, str, object]] = [
            (part.tool_call_id, part.tool_name, part.args)
            for part in response.parts
            if isinstance(part, ToolCallPart) and part.tool_name in self._definitions
        ]
        return calls if any(c[0] == call_id for c in calls) else this
