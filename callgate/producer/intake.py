"""What ``callgate submit``, ``collect``, ``tools`` and ``trace`` and the HTTP API share:
reading a submission's body, and the JSON each answers with. Pure, apart from the trace's
redaction (also pure)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from callgate.core.errors import InputError
from callgate.core.types import Turn

# The answer to a provider response that is a final answer: nothing recorded.
NO_CALLS: dict[str, Any] = {"turn_id": None, "calls": []}


def proposals_from(
    raw: Any, *, provider: str | None, stream: bool, known_tools: Collection[str]
) -> list[Any]:
    """The proposals of a submission: a JSON list of ``{call_id, tool_name, arguments}``, or
    a provider's raw response (or its stream events) read by that surface's adapter. A
    malformed one is refused with its adapter code before anything is recorded; an empty
    list from a provider is a final answer."""
    from callgate.producer import adapters

    if stream and not provider:
        raise InputError("a stream needs a provider SURFACE")
    if provider:
        if stream:
            if not isinstance(raw, list):
                raise InputError("a stream must be a JSON list of events")
            return list(adapters.read_stream(provider, raw, known_tools))
        return list(adapters.read_proposals(provider, raw, known_tools))
    if not isinstance(raw, list):
        raise InputError("proposals must be a JSON list of {call_id, tool_name, arguments}")
    return raw


def submitted(turn: Turn) -> dict[str, Any]:
    """What ``callgate submit --json`` prints and ``POST /v1/turns`` answers."""
    return {
        "turn_id": turn.turn_id,
        "calls": [
            {"call_id": c.call_id, "tool_name": c.tool_name, "operation_id": c.operation_id}
            for c in turn.calls
        ],
    }


def tool_definitions(
    definitions: list[dict[str, Any]], provider: str | None
) -> list[dict[str, Any]] | Any:
    """A role's allowlisted definitions, neutral or in ``provider``'s tool-schema form."""
    if not provider:
        return definitions
    from callgate.producer import adapters

    return adapters.tool_definitions(provider, definitions)


# The trace's fields a client chose: a call id or an operation id may hold whatever the
# client typed, a secret included, and a tool name whatever the model wrote.
_CHOSEN = ("call_id", "tool_name", "operation_id")


def redacted_trace(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trace events with their details redacted again (a row written by an older version, or
    by a path that forgot, is never shown raw), and the ids a client chose redacted and cut
    as every exit shows them."""
    from callgate.tools import redaction

    return [
        {
            **e,
            **{k: redaction.redact_id(e[k]) for k in _CHOSEN if isinstance(e.get(k), str)},
            "detail": redaction.redact_value(e["detail"], names=False),
        }
        for e in events
    ]
