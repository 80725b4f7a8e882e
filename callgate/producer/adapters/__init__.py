"""Provider adapters: one per API surface, never one per company.

An adapter only translates. It turns a surface's response into ``ProposedCall``s, turns
correlated results back into that surface's tool-result message, and renders tool
definitions in the surface's schema form. Authorization, approval and idempotency stay with
the gate and the executor. Everything here is pure: no I/O, no SDK imports (SDK response
objects are read through their ``model_dump``).

    from callgate.producer.adapters import read_proposals, write_results, tool_definitions

    calls = read_proposals("anthropic-messages", message, known_tools={"get_weather"})
    ...
    reply = write_results("anthropic-messages", calls, results)  # a user message

Every refusal is an ``AdapterError`` whose ``code`` is a stable ``ErrorCode`` value: the
inbound codes listed under ``read_proposals``, the correlation codes listed under
``write_results``, ``unsupported_surface``, and
``invalid_configuration``/``invalid_input`` for bad tool definitions or proposals given to
``tool_definitions``/``write_results``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from callgate.core.errors import ErrorCode
from callgate.core.types import ProposedCall
from callgate.producer.adapters import (
    anthropic_messages,
    gemini_generate_content,
    gemini_interactions,
    openai_chat,
    openai_responses,
    streaming,
)
from callgate.producer.adapters.base import (
    AdapterCorrelationError,
    AdapterError,
    fail,
    show,
    to_plain,
)
from callgate.producer.adapters.definitions import ToolSpec, specs
from callgate.producer.adapters.results import Result, as_proposals, correlate

__all__ = [
    "SURFACES",
    "AdapterCorrelationError",
    "AdapterError",
    "Envelope",
    "read_proposals",
    "read_stream",
    "tool_definitions",
    "write_results",
]

# A surface's result message: a list of messages/items, or one message object.
Envelope = list[dict[str, Any]] | dict[str, Any]


class _Reader(Protocol):
    def __call__(
        self,
        response: object,
        known_tools: frozenset[str],
        *,
        allow_missing_stop_reason: bool = False,
    ) -> list[ProposedCall]: ...


@dataclass(frozen=True)
class _Surface:
    read: _Reader
    write: Callable[[list[ProposedCall], list[Result]], Envelope]
    tools: Callable[[list[ToolSpec]], list[dict[str, Any]]]


_ADAPTERS: dict[str, _Surface] = {
    "openai-chat": _Surface(openai_chat.read, openai_chat.write, openai_chat.tools),
    "openai-responses": _Surface(
        openai_responses.read, openai_responses.write, openai_responses.tools
    ),
    "anthropic-messages": _Surface(
        anthropic_messages.read, anthropic_messages.write, anthropic_messages.tools
    ),
    "gemini-generate-content": _Surface(
        gemini_generate_content.read, gemini_generate_content.write, gemini_generate_content.tools
    ),
    "gemini-interactions": _Surface(
        gemini_interactions.read, gemini_interactions.write, gemini_interactions.tools
    ),
}

SURFACES: tuple[str, ...] = tuple(_ADAPTERS)


def _adapter(surface: str) -> _Surface:
    adapter = _ADAPTERS.get(surface) if isinstance(surface, str) else None
    if adapter is None:
        fail(
            ErrorCode.UNSUPPORTED_SURFACE,
            f"unknown API surface {show(surface)}; expected one of {', '.join(SURFACES)}",
        )
    return adapter


def read_proposals(
    surface: str,
    response: object,
    known_tools: Collection[str],
    *,
    allow_missing_stop_reason: bool = False,
) -> list[ProposedCall]:
    """The tool calls a model proposed in one ``surface`` response, in the model's order.

    ``response`` is the parsed JSON body (a dict), its JSON text, or the official SDK's
    response object. A final answer with no calls gives ``[]``. Every inbound fault raises an
    ``AdapterError`` before anything is returned: ``invalid_provider_envelope``,
    ``missing_tool_calls``, ``malformed_tool_calls``, ``invalid_arguments_json``,
    ``duplicate_call_id``, ``unknown_tool`` (a name that is no canonical spelling of any tool
    name under ``callgate.producer.adapters.names``), ``invalid_tool_call_field``. A
    well-formed name not in ``known_tools`` (a tool the model invented) is proposed as it is:
    the gate ends that call alone with ``unknown_tool``, and the response's other calls run.
    Arguments come back as a parsed JSON object. A response that never finished — a null
    stop/finish reason or status, as in an SDK stream helper's snapshot of a cut-off stream
    (``get_final_message()``, ``get_final_completion()``) or an SDK object without one — is
    ``invalid_provider_envelope``. So is one that leaves the reason out (``finish_reason``,
    ``status``, ``stop_reason``, ``finishReason``; a bare Chat Completions assistant message
    has none): that is what a stream joined by the application's own code or a proxy looks
    like when it was cut off. A response you built yourself states its reason, or passes
    ``allow_missing_stop_reason=True`` to have it read as finished (a null is refused still).
    """
    adapter = _adapter(surface)
    return adapter.read(
        to_plain(response),
        frozenset(known_tools),
        allow_missing_stop_reason=allow_missing_stop_reason,
    )


def read_stream(
    surface: str, events: Iterable[object], known_tools: Collection[str]
) -> list[ProposedCall]:
    """The same proposals as ``read_proposals``, from a stream's chunks or events.

    Every surface: the SDK's raw stream events or chunks, the events of its stream helpers
    (``chat.completions.stream()``, ``responses.stream()``, ``messages.stream()``), Gemini
    chunks including Vertex AI's streamed arguments (``partialArgs``), and Gemini
    Interactions events (see ``callgate.producer.adapters.streaming``). Arguments that reassemble to
    invalid JSON raise ``invalid_arguments_json``; a stream that stops before its stop signal
    is refused.
    """
    _adapter(surface)
    return streaming.read_stream(surface, events, frozenset(known_tools))


def write_results(surface: str, proposals: Iterable[object], results: Iterable[object]) -> Envelope:
    """The ``surface``'s own tool-result message for a turn's results.

    First asserts complete correlation — each result matches exactly one proposal
    by ``call_id`` with the same ``tool_name``, every proposal has exactly one terminal
    result — and raises ``AdapterCorrelationError`` (``missing_result``, ``duplicate_result``,
    ``extra_result``, ``tool_name_mismatch``, ``non_terminal_result``) otherwise. Results
    may be ``Succeeded``/``FailedRetryable``/``FailedTerminal`` values or plain dicts. Each
    result's body is ``{"status", "data"}`` or ``{"status", "error": {"code", "details",
    "retry_after_ms"}}``, so a failure keeps its code and safe details.

    Shapes: openai-chat a list of ``role: tool`` messages; openai-responses a list of
    ``function_call_output`` items; anthropic-messages one ``user`` message of
    ``tool_result`` blocks (``is_error`` on failures); gemini-generate-content one ``user``
    content of ``functionResponse`` parts; gemini-interactions ``{"input": [function_result
    ...]}``. Items follow the caller's order, except on Gemini GenerateContent when a call
    had no provider id: then the model's call order, which Gemini matches by position. No
    proposals at all is ``invalid_input``: there is nothing to send back.
    """
    adapter = _adapter(surface)
    calls = as_proposals(proposals)
    if not calls:
        # An empty tool-result message is refused by Anthropic and Gemini and means nothing
        # anywhere: a turn without calls has no results to send back.
        fail(ErrorCode.INVALID_INPUT, "no proposals: there are no results to write")
    return adapter.write(calls, correlate(calls, results))


def tool_definitions(surface: str, tools: Iterable[object]) -> list[dict[str, Any]]:
    """``tools`` in ``surface``'s tool-schema form.

    Each tool is a mapping or an object with ``name``, ``description`` and ``parameters`` (a
    JSON Schema for an object; an object with a pydantic ``arguments`` model works too).
    Names the surface does not accept are encoded reversibly (``callgate.producer.adapters.names``);
    ``read_proposals`` maps them back.
    """
    return _adapter(surface).tools(specs(tools))
