"""The gate's decisions over typed values (SPEC §3). No I/O: callers pass server facts in.

Order: allowlist → arguments parse → schema. Business rules, authorization, approval and the
operation register follow in later layers; each raises a ``ToolError`` with a stable code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from store.errors import ErrorCode, ToolError
from worker.registry import Registry, Tool


def check_allowed(registry: Registry, tool_name: str, roles: Iterable[str]) -> Tool:
    """Steps 1: the tool exists and this principal's roles allow it."""
    tool = registry.require(tool_name)
    if tool.name not in registry.allowed_for(roles):
        raise ToolError(
            f"tool {tool_name!r} is not allowed for this user", code=ErrorCode.TOOL_NOT_ALLOWED
        )
    return tool


def parse_arguments(raw: Mapping[str, Any] | str) -> dict[str, Any]:
    """Step 2: arguments are a JSON object (providers send them as a string or an object)."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ToolError(
                "arguments are not valid JSON", code=ErrorCode.INVALID_ARGUMENTS_JSON
            ) from None
    else:
        value = raw
    if not isinstance(value, dict):
        raise ToolError(
            "arguments must be a JSON object",
            code=ErrorCode.INVALID_ARGUMENTS,
            details=[{"path": "", "code": "type", "expected": "object"}],
        )
    return value


def validate_arguments(tool: Tool, arguments: Mapping[str, Any]) -> BaseModel:
    """Step 3: schema. Details name the field and the rule, never the received value."""
    try:
        return tool.arguments.model_validate(dict(arguments), strict=True)
    except ValidationError as exc:
        raise ToolError(
            f"arguments do not match {tool.name}'s schema",
            code=ErrorCode.INVALID_ARGUMENTS,
            details=schema_details(exc),
        ) from None


def schema_details(exc: ValidationError) -> list[dict[str, Any]]:
    details = []
    for err in exc.errors(include_input=False, include_url=False):
        details.append(
            {
                "path": json_pointer(err["loc"]),
                "code": err["type"],
                "expected": _expected(err),
            }
        )
    return details


def json_pointer(loc: Iterable[int | str]) -> str:
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in loc]
    return "".join("/" + p for p in parts)


def _expected(err: Mapping[str, Any]) -> str:
    ctx = err.get("ctx") or {}
    if "expected" in ctx:
        return str(ctx["expected"])
    kind = str(err["type"])
    return {
        "missing": "a value",
        "extra_forbidden": "no such field",
        "int_type": "integer",
        "string_type": "string",
        "bool_type": "boolean",
        "float_type": "number",
        "dict_type": "object",
        "list_type": "array",
    }.get(kind, kind.replace("_", " "))
