"""The gate's decisions over typed values. No I/O: callers pass server facts in.

Order: allowlist → arguments parse → schema → business rules → authorization → risk. Each
layer raises a ``ToolError`` with a stable code, or returns what the next layer needs. The
executor runs them in this order, then the approval and the operation register (which need
Postgres), so an approval can never bypass an earlier layer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema import ValidationError as SchemaError
from jsonschema.exceptions import SchemaError as BadSchema
from pydantic import BaseModel, ValidationError

from callgate.core import values
from callgate.core.errors import ConfigurationError, ErrorCode, JSONValueError, ToolError
from callgate.tools.registry import Arguments, Facts, Principal, Registry, Tool

LAYERS = ("allowlist", "parse", "schema", "business", "authorization", "risk")


def check_allowed(registry: Registry, tool_name: str, roles: Iterable[str]) -> Tool:
    """Steps 1: the tool exists and this principal's roles allow it."""
    tool = registry.require(tool_name)
    if tool.name not in registry.allowed_for(roles):
        raise ToolError(
            f"tool {tool_name!r} is not allowed for this user", code=ErrorCode.TOOL_NOT_ALLOWED
        )
    return tool


def parse_arguments(raw: Mapping[str, Any] | str) -> dict[str, Any]:
    """Step 2: arguments are a JSON object (providers send them as a string or an object).

    A string is parsed strictly, as submit checks it: no NaN or Infinity, no number that
    overflows, no key twice in one object (last-wins would pick one of two meanings), no
    nesting past ``MAX_JSON_DEPTH``, no value PostgreSQL could not store with the result.
    """
    if isinstance(raw, str):
        try:
            value = values.loads(raw)
        except JSONValueError as exc:
            message = "arguments are not valid JSON"
            raise ToolError(
                message if exc.syntax else f"{message}: {exc.message}",
                code=ErrorCode.INVALID_ARGUMENTS_JSON,
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


def validate_arguments(tool: Tool, arguments: Mapping[str, Any]) -> Arguments:
    """Step 3: schema. Details name the field and the rule, never the received value."""
    if isinstance(tool.arguments, Mapping):
        details = check_arguments(tool.arguments, arguments)
        if details:
            raise ToolError(
                f"arguments do not match {tool.name}'s schema",
                code=ErrorCode.INVALID_ARGUMENTS,
                details=details,
            )
        return dict(arguments)
    # A field the model does not declare is refused even when the tool's model would ignore
    # it (pydantic's default): an argument nobody checks must not reach a handler that may
    # read it some other way. Only a model that says extra="allow" takes unknown fields.
    ignores_extra = tool.arguments.model_config.get("extra") in (None, "ignore")
    unexpected = sorted(set(arguments) - _accepted_names(tool.arguments)) if ignores_extra else []
    try:
        validated = tool.arguments.model_validate(dict(arguments), strict=True)
    except ValidationError as exc:
        raise ToolError(
            f"arguments do not match {tool.name}'s schema",
            code=ErrorCode.INVALID_ARGUMENTS,
            details=schema_details(exc) + _extra_details(unexpected),
        ) from None
    if unexpected:
        raise ToolError(
            f"arguments do not match {tool.name}'s schema",
            code=ErrorCode.INVALID_ARGUMENTS,
            details=_extra_details(unexpected),
        )
    return validated


def _accepted_names(model: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    for name, field in model.model_fields.items():
        names.add(name)
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
    return names


def _extra_details(names: list[str]) -> list[dict[str, Any]]:
    return [
        {"path": json_pointer([n]), "code": "extra_forbidden", "expected": "no such field"}
        for n in names
    ]


def check_arguments(json_schema: Mapping[str, Any], arguments: Any) -> list[dict[str, Any]]:
    """Check ``arguments`` against a JSON Schema (draft 2020-12).

    Returns the ``invalid_arguments`` details ``[{path, code, expected}]`` with JSON Pointer
    paths, in path order; an empty list when the arguments are valid. The received value is
    never part of a detail. A schema that is itself invalid is a configuration error.
    """
    try:
        Draft202012Validator.check_schema(json_schema)
    except BadSchema as exc:
        raise ConfigurationError(f"tool schema is not a valid JSON Schema: {exc.message}") from None
    validator = Draft202012Validator(json_schema)
    details: list[dict[str, Any]] = []
    for err in validator.iter_errors(arguments):
        details.extend(_json_schema_details(err))
    unique = {(d["path"], d["code"], d["expected"]): d for d in details}
    return sorted(unique.values(), key=lambda d: (d["path"], d["code"]))


def _json_schema_details(err: SchemaError) -> list[dict[str, Any]]:
    path = list(err.absolute_path)
    kind = str(err.validator)
    value = err.validator_value
    instance = err.instance
    if kind == "required" and isinstance(instance, dict):
        return [
            {"path": json_pointer([*path, name]), "code": "missing", "expected": "a value"}
            for name in value
            if name not in instance
        ]
    if kind == "additionalProperties" and isinstance(instance, dict):
        schema = err.schema if isinstance(err.schema, dict) else {}
        known = set(schema.get("properties", {}))
        return [
            {
                "path": json_pointer([*path, name]),
                "code": "extra_forbidden",
                "expected": "no such field",
            }
            for name in instance
            if name not in known
        ]
    expected = {
        "type": lambda v: " or ".join(v) if isinstance(v, list) else str(v),
        "enum": lambda v: "one of " + ", ".join(json.dumps(x) for x in v),
        "const": lambda v: json.dumps(v),
        "minLength": lambda v: f"at least {v} characters",
        "maxLength": lambda v: f"at most {v} characters",
        "minimum": lambda v: f">= {v}",
        "maximum": lambda v: f"<= {v}",
        "exclusiveMinimum": lambda v: f"> {v}",
        "exclusiveMaximum": lambda v: f"< {v}",
        "pattern": lambda v: f"matching {v}",
        "format": lambda v: f"format {v}",
        "minItems": lambda v: f"at least {v} items",
        "maxItems": lambda v: f"at most {v} items",
    }.get(kind, lambda v: kind)(value)
    return [{"path": json_pointer(path), "code": kind, "expected": expected}]


def check_business(tool: Tool, args: Arguments, facts: Facts, principal: Principal) -> None:
    """Step 4: is this value possible in the current server state?"""
    if tool.validate is not None:
        tool.validate(args, facts, principal)


def resolve_facts(
    tool: Tool,
    args: Arguments,
    principal: Principal,
    attempt: Callable[[Callable[[], Facts]], Facts] = lambda read: read(),
) -> Facts:
    """Step 4: the status lookup behind the intent and the business and authorization layers
    (``tool.resolve``), run by ``attempt`` (the worker retries a dropped connection). A lookup
    that refuses raises its own ``ToolError``; one that fails otherwise could not read the
    resource's state, and the same call may work later: ``upstream_unavailable``,
    retryable, with the failure as its cause. The worker and ``LocalRunner`` both call this,
    so a failing lookup ends a call the same way in both."""
    if tool.resolve is None:
        return Facts()
    resolve = tool.resolve
    try:
        return attempt(lambda: resolve(args, principal))
    except ToolError:
        raise
    except Exception as exc:
        raise ToolError(
            "could not read the resource's current state", code=ErrorCode.UPSTREAM_UNAVAILABLE
        ) from exc


def check_authorized(tool: Tool, args: Arguments, facts: Facts, principal: Principal) -> None:
    """Step 5: may this principal act on the canonical resource?"""
    if tool.authorize is not None:
        tool.authorize(args, facts, principal)


def assess_risk(
    tool: Tool, args: Arguments, facts: Facts, principal: Principal
) -> dict[str, Any] | None:
    """Step 6: the server-computed impact when the call needs an approval, else ``None``.
    The approver is told whether it can be undone: the tool's declared effect, unless its
    risk policy says so itself."""
    if tool.risk is None:
        return None
    impact = tool.risk(args, facts, principal)
    if impact is None or "reversible" in impact:
        return impact
    return {**impact, "reversible": tool.effect.reversible}


# --- the pipeline: the layers in order, shared by the worker and LocalRunner --------------------
#
# Each records its verdict per layer in ``verdicts`` ("pass", or the refusal's code) and raises
# the refusal. Between the two halves the caller resolves the facts (``resolve_facts``): the
# worker first reuses an outcome its operation already has for the same intent.


def admit_call(
    registry: Registry,
    tool_name: str,
    raw_arguments: Mapping[str, Any] | str,
    roles: Iterable[str],
    verdicts: dict[str, str],
) -> tuple[Tool, Arguments]:
    """Layers 1–3, on the call alone: allowlist, arguments parse, schema."""
    layer = "allowlist"
    try:
        tool = check_allowed(registry, tool_name, roles)
        verdicts[layer] = "pass"
        layer = "parse"
        raw = raw_arguments
        if isinstance(raw, Mapping):
            raw = raw.get(values.RAW_ARGUMENTS, raw)
        arguments = parse_arguments(raw)
        verdicts[layer] = "pass"
        layer = "schema"
        args = validate_arguments(tool, arguments)
        verdicts[layer] = "pass"
    except ToolError as err:
        verdicts[layer] = err.code.value
        raise
    return tool, args


def judge(
    tool: Tool, args: Arguments, facts: Facts, principal: Principal, verdicts: dict[str, str]
) -> dict[str, Any] | None:
    """Layers 4–6, on server state: business rules, authorization, risk. Returns the impact
    an approver must see, or None when no approval is needed."""
    layer = "business"
    try:
        check_business(tool, args, facts, principal)
        verdicts[layer] = "pass"
        layer = "authorization"
        check_authorized(tool, args, facts, principal)
        verdicts[layer] = "pass"
        layer = "risk"
        impact = assess_risk(tool, args, facts, principal)
        verdicts[layer] = "approval_required" if impact is not None else "no_approval_needed"
    except ToolError as err:
        verdicts[layer] = err.code.value
        raise
    return impact


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


def same_person(requested_by: str, decider: str) -> bool:
    """The four-eyes rule's one comparison: is the decider the person who asked? Names are
    compared by Unicode case folding (``Ana`` is ``ANA``, ``ΣΑΣ`` is ``σας``), here in
    Python for the worker, the approval commands, the API and ``LocalRunner`` alike; never by
    the database, whose ``lower()`` follows its collation and disagrees with Python on some
    letters."""
    return requested_by.strip().casefold() == decider.strip().casefold()
