"""Drop-in tool runners for agent frameworks: the framework's model proposes tool calls, callgate
runs them through its gate, queue, workers and guarantees.

Each integration is a module of its own and imports its framework only when it is imported
(install the extra of the same name)::

    from callgate.producer.frameworks.openai_agents import AgentsGate  # callgate[openai-agents]
    from callgate.producer.frameworks.pydantic_ai import CallgateToolset  # callgate[pydantic-ai]
    from callgate.producer.frameworks.langgraph import CallgateToolNode  # callgate[langgraph]

What they share (submitting a model turn, waiting for each call's outcome, and what a model
is shown for a result, a refusal or an approval still pending) is in ``relay``.
"""
