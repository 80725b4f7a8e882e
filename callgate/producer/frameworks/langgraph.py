"""LangGraph: a tool node that runs a model message's tool calls through callgate (extra
``callgate[langgraph]``).

    tools = CallgateToolNode(producer, context)  # an AsyncProducer; the server-trusted context
    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)  # the model bound to tools.tool_schemas()
    graph.add_node("tools", tools)
    ...  # edges as with langgraph.prebuilt.ToolNode; run it with ainvoke/astream

The node takes the last ``AIMessage`` of the state's messages and submits all of its tool
calls as ONE callgate turn: reads run at once, writes one at a time in the order the model
proposed them, each through the gate. It returns one ``ToolMessage`` per tool call, joined
by ``tool_call_id``: callgate's safe result (``status="success"``) or its coded failure
(``status="error"``). Calls LangChain could not parse (``invalid_tool_calls``) are submitted
as the model wrote them, and the gate refuses them with ``invalid_arguments_json``.

The context is fixed at construction, or read per run from
``config["configurable"]["callgate_context"]``. A call the gate parks for approval
interrupts the graph (``langgraph.types.interrupt``; a checkpointer is needed) with
``{"callgate_approvals": [{call_id, tool_name, approval_id, impact}]}``. Another person of
the tenant approves it in callgate (``callgate approvals approve``); resume the graph with
``Command(resume=...)``: the node runs again, its calls join the operations they started
(nothing runs twice), and the approved call's result comes back. Resumed while callgate's
request is still pending, the node interrupts again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from callgate.core.errors import InputError
from callgate.core.types import CallContext, ProposedCall
from callgate.producer.async_producer import AsyncProducer
from callgate.producer.frameworks import relay
from callgate.producer.frameworks.relay import CallOutcome, Done, Parked, TurnRelay

relay.require("langgraph", "langgraph", __name__)

from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig, RunnableLambda  # noqa: E402
from langgraph.types import interrupt  # noqa: E402

__all__ = ["CONTEXT_KEY", "CallgateToolNode"]

# Where a run's server-trusted CallContext may be given: config["configurable"][CONTEXT_KEY].
CONTEXT_KEY = "callgate_context"


class CallgateToolNode(RunnableLambda[Any, Any]):
    """A LangGraph node (like ``langgraph.prebuilt.ToolNode``) whose calls run in callgate.

    ``context`` is the server-trusted ``CallContext`` (from your session, never from the
    model); leave it out to take it per run from ``config["configurable"]["callgate_context"]``.
    ``producer`` is an ``AsyncProducer`` made on the running event loop. ``timeout`` bounds
    the wait for the turn's results, in seconds. The state is a list of messages or a mapping
    whose ``messages_key`` holds them; the node returns the same shape.
    """

    def __init__(
        self,
        producer: AsyncProducer,
        context: CallContext | Mapping[str, Any] | None = None,
        *,
        timeout: float = relay.DEFAULT_TIMEOUT_SECONDS,
        messages_key: str = "messages",
        name: str = "tools",
    ) -> None:
        if not isinstance(producer, AsyncProducer):
            raise InputError(
                f"CallgateToolNode needs an AsyncProducer, not {type(producer).__name__}"
            )
        self.producer = producer
        self.context = None if context is None else relay.as_context(context)
        self.timeout = relay.checked_timeout(timeout)
        self.messages_key = messages_key
        super().__init__(self._run, name=name)

    def tool_schemas(self, context: CallContext | Mapping[str, Any] | None = None) -> list[Any]:
        """The tools the context's roles may use, in OpenAI's function-tool form, for
        ``chat_model.bind_tools(...)``."""
        gate = TurnRelay(self.producer, self._context_or(context), timeout=self.timeout)
        return [{"type": "function", "function": d} for d in gate.definitions()]

    async def _run(self, state: Any, config: RunnableConfig) -> Any:
        configurable = (config or {}).get("configurable") or {}
        context = self._context_or(configurable.get(CONTEXT_KEY))
        message = self._last_ai_message(state)
        calls = _proposals(message)
        if not calls:
            return self._shaped(state, [])
        gate = TurnRelay(self.producer, context, timeout=self.timeout)
        outcomes = await gate.run(calls)
        while parked := [o for o in outcomes if isinstance(o, Parked)]:
            interrupt({"callgate_approvals": [_approval(p) for p in parked]})
            # Resumed: the approvals may have been decided; look again.
            outcomes = await gate.run(calls)
        names = {c.call_id: n for c, n in zip(calls, _names(message), strict=True)}
        return self._shaped(state, [_tool_message(o, names[o.call_id]) for o in outcomes])

    def _context_or(self, given: object) -> CallContext:
        if given is not None:
            if self.context is not None and relay.as_context(given) != self.context:
                raise InputError("this tool node is bound to another CallContext")
            return relay.as_context(given)
        if self.context is None:
            raise InputError(
                "CallgateToolNode has no CallContext: pass context= or "
                f'config={{"configurable": {{"{CONTEXT_KEY}": ...}}}}'
            )
        return self.context

    def _last_ai_message(self, state: Any) -> AIMessage:
        messages: Any = state
        if isinstance(state, Mapping):
            messages = state.get(self.messages_key)
        if not isinstance(messages, Sequence) or not messages:
            raise InputError(f"the tool node's input has no messages (key {self.messages_key!r})")
        last = messages[-1]
        if not isinstance(last, AIMessage):
            raise InputError(
                f"the tool node runs the last message's tool calls; it is a "
                f"{type(last).__name__}, not an AIMessage"
            )
        return last

    def _shaped(self, state: Any, messages: list[ToolMessage]) -> Any:
        if isinstance(state, Mapping):
            return {self.messages_key: messages}
        return messages


def _calls_of(message: AIMessage) -> list[tuple[str, str, object]]:
    """(call id, name, arguments) of every tool call, parsed or not, in message order."""
    calls: list[tuple[str, str, object]] = [
        (str(c["id"]), c["name"], c["args"]) for c in message.tool_calls if c.get("id")
    ]
    calls += [
        (str(c["id"]), str(c.get("name") or "unnamed"), c.get("args") or "")
        for c in message.invalid_tool_calls
        if c.get("id")
    ]
    return calls


def _proposals(message: AIMessage) -> list[ProposedCall]:
    return relay.proposals(_calls_of(message))


def _names(message: AIMessage) -> list[str]:
    return [name for _, name, _ in _calls_of(message)]


def _approval(parked: Parked) -> dict[str, Any]:
    return {"call_id": parked.call_id, "tool_name": parked.tool_name, **parked.metadata}


def _tool_message(outcome: CallOutcome, name: str) -> ToolMessage:
    ok = isinstance(outcome, Done) and outcome.ok
    return ToolMessage(
        content=relay.body_text(outcome),
        tool_call_id=outcome.call_id,
        name=name,
        status="success" if ok else "error",
    )
