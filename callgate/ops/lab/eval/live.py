"""``callgate eval run --live MODEL``: ask a provider for the answers instead of reading
recorded ones, through its official SDK (the ``sdk`` extra), with the key the SDK reads from
the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY).

A ``Conversation`` keeps one fixture's messages in the surface's own shape: the user's
request, the model's response, callgate's tool-result message (``Collected.provider_message``)
and the next request. The runner asks it for each turn's response and, when a turn has a final
answer to score, for the answer after the results. Tests pass a client built over a mock
transport; nothing here opens a connection by itself until ``respond``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from callgate.core.errors import ConfigurationError, InputError
from callgate.producer import adapters
from callgate.tools.registry import Described

LIVE_SURFACES = ("openai-chat", "openai-responses", "anthropic-messages")
MAX_TOKENS = 1024


def client_for(surface: str) -> Any:
    """The official SDK's client for ``surface``; it reads its key from the environment."""
    try:
        if surface == "anthropic-messages":
            import anthropic

            return anthropic.Anthropic()
        if surface in ("openai-chat", "openai-responses"):
            import openai

            return openai.OpenAI()
    except ImportError:
        raise ConfigurationError(
            "callgate eval --live asks the provider through its SDK: pip install 'callgate[sdk]'"
        ) from None
    except Exception as exc:  # the SDK refuses to start without a key
        raise ConfigurationError(f"--live on {surface}: {exc}") from None
    raise InputError(f"--live supports the surfaces {', '.join(LIVE_SURFACES)}, not {surface!r}")


@dataclass
class Conversation:
    """One fixture's exchange with a live model on one surface."""

    surface: str
    model: str
    client: Any
    tools: Sequence[Described]  # the tools the fixture exposes
    messages: list[Any] = field(default_factory=list)

    def ask(self, text: str) -> Any:
        """Add the user's ``text`` and return the model's response (a plain dict)."""
        self.messages.append({"role": "user", "content": text})
        return self._respond()

    def answer_results(self, envelope: Any) -> Any:
        """Add callgate's tool-result message and return the model's next response."""
        if isinstance(envelope, list):
            self.messages.extend(envelope)
        else:
            self.messages.append(envelope)
        return self._respond()

    def _respond(self) -> Any:
        call = _CALLS[self.surface]
        shown = [t.definition() for t in self.tools]
        definitions = adapters.tool_definitions(self.surface, shown) if shown else []
        response = call(self.client, self.model, self.messages, definitions)
        plain: dict[str, Any] = response.model_dump(mode="json", exclude_none=True)
        self.messages.extend(_ASSISTANT[self.surface](plain))
        return plain


def _chat(client: Any, model: str, messages: list[Any], tools: list[Any]) -> Any:
    extra = {"tools": tools} if tools else {}
    return client.chat.completions.create(model=model, messages=messages, **extra)


def _responses(client: Any, model: str, messages: list[Any], tools: list[Any]) -> Any:
    extra = {"tools": tools} if tools else {}
    return client.responses.create(model=model, input=messages, **extra)


def _messages(client: Any, model: str, messages: list[Any], tools: list[Any]) -> Any:
    extra = {"tools": tools} if tools else {}
    return client.messages.create(model=model, max_tokens=MAX_TOKENS, messages=messages, **extra)


_CALLS: dict[str, Callable[[Any, str, list[Any], list[Any]], Any]] = {
    "openai-chat": _chat,
    "openai-responses": _responses,
    "anthropic-messages": _messages,
}

# The model's response as the messages that continue the conversation.
_ASSISTANT: dict[str, Callable[[dict[str, Any]], list[Any]]] = {
    "openai-chat": lambda r: [r["choices"][0]["message"]],
    "openai-responses": lambda r: list(r.get("output") or []),
    "anthropic-messages": lambda r: [{"role": "assistant", "content": r.get("content") or []}],
}
