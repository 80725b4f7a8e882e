"""What the runner reads of a recorded response besides its calls: the tool names it
mentions (so a call to a tool the model invented is read, and scored, instead of refused by
the adapter) and its text (the final answer). Pure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from callgate.producer.adapters.names import tool_name


def mentioned_names(surface: str, response: Any) -> set[str]:
    """Every string under a ``name`` key, decoded as the adapters decode tool names."""
    found: set[str] = set()
    for value in _named(response):
        decoded = tool_name(surface, value)
        found.add(decoded if decoded is not None else value)
    return found


def _named(doc: Any) -> Iterator[str]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "name" and isinstance(value, str):
                yield value
            else:
                yield from _named(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _named(item)


def text_of(surface: str, response: Any) -> str:
    """The model's text in one response on ``surface`` (its parts joined by newlines)."""
    parts: list[str] = []
    if not isinstance(response, dict):
        return ""
    if surface == "openai-chat":
        for choice in response.get("choices") or []:
            content = (choice.get("message") or {}).get("content")
            if isinstance(content, str):
                parts.append(content)
    elif surface == "openai-responses":
        for item in response.get("output") or []:
            for piece in item.get("content") or []:
                if piece.get("type") == "output_text":
                    parts.append(str(piece.get("text", "")))
    elif surface == "anthropic-messages":
        for block in response.get("content") or []:
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
    elif surface == "gemini-generate-content":
        for candidate in response.get("candidates") or []:
            for part in (candidate.get("content") or {}).get("parts") or []:
                if "text" in part and not part.get("thought"):
                    parts.append(str(part["text"]))
    elif surface == "gemini-interactions":
        for step in response.get("steps") or []:
            if step.get("type") == "model_output":
                for piece in step.get("content") or []:
                    if piece.get("type") == "text":
                        parts.append(str(piece.get("text", "")))
    return "\n".join(parts)
