"""Neutral tool definitions: the one shape every surface's tool-schema form is built from."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from callgate.core.errors import ErrorCode
from callgate.producer.adapters.base import fail, show


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema for an object


def _attr(tool: object, key: str) -> object:
    if isinstance(tool, Mapping):
        return tool.get(key)
    return getattr(tool, key, None)


def _parameters(tool: object, name: str) -> dict[str, Any]:
    params = _attr(tool, "parameters")
    if params is None:
        # worker.registry.Tool carries a pydantic model class instead of a schema.
        model = _attr(tool, "arguments")
        schema_of = getattr(model, "model_json_schema", None)
        params = schema_of() if callable(schema_of) else {"type": "object", "properties": {}}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        fail(ErrorCode.INVALID_CONFIGURATION, f"tool {show(name)}: parameters is not a JSON object")
    if params.get("type", "object") != "object":
        fail(
            ErrorCode.INVALID_CONFIGURATION,
            f"tool {show(name)}: parameters must describe an object",
        )
    # Anthropic's input_schema requires "type": "object"; a schema that leaves it implicit
    # still describes arguments, which are always an object, so say so explicitly.
    return {"type": "object", **params}


def specs(tools: Iterable[object]) -> list[ToolSpec]:
    """Read tool definitions given as mappings or objects with name/description/parameters."""
    result: list[ToolSpec] = []
    seen: set[str] = set()
    for tool in tools:
        name = _attr(tool, "name")
        if not isinstance(name, str) or not name:
            fail(ErrorCode.INVALID_CONFIGURATION, "a tool definition has no name")
        if name in seen:
            fail(ErrorCode.INVALID_CONFIGURATION, f"two tool definitions are named {show(name)}")
        seen.add(name)
        description = _attr(tool, "description")
        if description is None:
            description = ""
        if not isinstance(description, str):
            fail(ErrorCode.INVALID_CONFIGURATION, f"tool {show(name)}: description is not text")
        result.append(ToolSpec(name, description, _parameters(tool, name)))
    return result
