"""``@tool``: declare a tool from a typed function instead of filling ``Tool`` by hand.

The argument model comes from the signature (pydantic; unknown fields are refused), the
description and per-argument descriptions from the docstring (its first paragraph, and a
Google-style ``Args:`` section), and the result schema from the return annotation when it is
a pydantic model. A parameter annotated ``ExecutionContext`` receives the call's context
(idempotency key, fencing token, ...) and is not part of the arguments a model sees.

Reads need nothing more. A write must say what it does to the world and what its downstream
offers against duplicates (``effect=`` and ``downstream=``): callgate's defaults for those
are the unsafe ones, so a write that leaves them out is refused at declaration instead of
silently being treated as irreversible and unprotected. Pure: no I/O.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

from callgate.core.errors import ConfigurationError
from callgate.tools.registry import (
    READ_ONLY,
    Authorizer,
    BusinessRule,
    Downstream,
    ExecutionContext,
    Kind,
    Resolver,
    ResultLimits,
    RiskPolicy,
    SideEffect,
    StatusLookup,
    Tool,
)

DEFAULT_LIMITS = ResultLimits()
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    kind: Kind = "read",
    effect: SideEffect | None = None,
    downstream: Downstream | None = None,
    lookup: StatusLookup | None = None,
    resolve: Resolver | None = None,
    validate: BusinessRule | None = None,
    authorize: Authorizer | None = None,
    risk: RiskPolicy | None = None,
    audit_field: str | None = None,
    limits: ResultLimits = DEFAULT_LIMITS,
    version: str = "1",
    policy_version: str = "1",
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    kind: Kind = "read",
    effect: SideEffect | None = None,
    downstream: Downstream | None = None,
    lookup: StatusLookup | None = None,
    resolve: Resolver | None = None,
    validate: BusinessRule | None = None,
    authorize: Authorizer | None = None,
    risk: RiskPolicy | None = None,
    audit_field: str | None = None,
    limits: ResultLimits = DEFAULT_LIMITS,
    version: str = "1",
    policy_version: str = "1",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function (plain or ``async def``) into a ``Tool``.

    ``@tool`` declares a read. A write is ``@tool(kind="write", effect=SideEffect(...),
    downstream=Downstream(...))``, with ``lookup=`` when the downstream can tell whether a
    write applied (``downstream.status_lookup``). Raises ``ConfigurationError`` for a write
    that does not state both, for a missing description, and for parameters without types.
    """

    def declare(function: Callable[..., Any]) -> Tool:
        return _declare(
            function,
            name=name or function.__name__,
            description=description,
            kind=kind,
            effect=effect,
            downstream=downstream,
            lookup=lookup,
            hooks={"resolve": resolve, "validate": validate, "authorize": authorize, "risk": risk},
            audit_field=audit_field,
            limits=limits,
            version=version,
            policy_version=policy_version,
        )

    return declare(fn) if fn is not None else declare


def _declare(
    function: Callable[..., Any],
    *,
    name: str,
    description: str | None,
    kind: Kind,
    effect: SideEffect | None,
    downstream: Downstream | None,
    lookup: StatusLookup | None,
    hooks: Mapping[str, Any],
    audit_field: str | None,
    limits: ResultLimits,
    version: str,
    policy_version: str,
) -> Tool:
    where = f"@tool {name!r}"
    if kind not in ("read", "write"):
        raise ConfigurationError(f"{where}: kind must be 'read' or 'write', not {kind!r}")
    if kind == "write":
        missing = [n for n, v in (("effect", effect), ("downstream", downstream)) if v is None]
        if missing:
            raise ConfigurationError(
                f"{where} is a write but does not state {' or '.join(missing)}: say whether "
                "applying it twice is harmless and reversible (effect=SideEffect(idempotent=..., "
                "reversible=...)) and what its downstream offers against duplicates and stale "
                "workers (downstream=Downstream(idempotency_keys=..., fencing=..., "
                "status_lookup=...)); callgate never assumes a write is safe"
            )
    offered = downstream or Downstream()
    if offered.status_lookup and lookup is None:
        raise ConfigurationError(
            f"{where}: downstream.status_lookup=True needs lookup= (the function that tells, "
            "by idempotency key, whether the write applied)"
        )
    docstring = inspect.getdoc(function) or ""
    summary = description or _summary(docstring)
    if not summary:
        raise ConfigurationError(
            f"{where} has no description: a model chooses tools by it; write a docstring "
            "or pass description="
        )
    try:
        hints = get_type_hints(function, include_extras=True)
    except (NameError, TypeError) as exc:
        raise ConfigurationError(f"{where}: cannot resolve its type hints ({exc})") from None
    arguments, context_param = _arguments_model(function, hints, _arg_docs(docstring), where)
    returns = hints.get("return")
    result = returns if isinstance(returns, type) and issubclass(returns, BaseModel) else None
    return Tool(
        name=name,
        description=summary,
        arguments=arguments,
        kind=kind,
        handler=_handler(function, arguments, context_param, returns),
        version=version,
        effect=effect if effect is not None else (READ_ONLY if kind == "read" else SideEffect()),
        downstream=offered,
        result=result,
        limits=limits,
        audit_field=audit_field,
        resolve=hooks["resolve"],
        lookup=lookup,
        validate=hooks["validate"],
        authorize=hooks["authorize"],
        risk=hooks["risk"],
        policy_version=policy_version,
    )


def _arguments_model(
    function: Callable[..., Any], hints: Mapping[str, Any], docs: Mapping[str, str], where: str
) -> tuple[type[BaseModel], str | None]:
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"{where}: *{param.name} cannot be shown to a model")
        annotation = hints.get(param.name)
        if annotation is ExecutionContext:
            context_param = param.name
            continue
        if annotation is None:
            raise ConfigurationError(f"{where}: parameter {param.name!r} has no type annotation")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=docs.get(param.name)))
    model = create_model(
        f"{_camel(function.__name__)}Arguments",
        __config__=ConfigDict(extra="forbid"),
        **fields,
    )
    return model, context_param


def _handler(
    function: Callable[..., Any],
    arguments: type[BaseModel],
    context_param: str | None,
    returns: Any,
) -> Callable[..., Any]:
    names = list(arguments.model_fields)
    dump = _dumper(returns)

    def call_args(args: BaseModel, ctx: ExecutionContext) -> dict[str, Any]:
        values = {n: getattr(args, n) for n in names}
        if context_param is not None:
            values[context_param] = ctx
        return values

    if inspect.iscoroutinefunction(function):

        async def run_async(args: BaseModel, ctx: ExecutionContext) -> dict[str, Any]:
            return dump(await function(**call_args(args, ctx)))

        run_async.__name__ = function.__name__
        return run_async

    def run(args: BaseModel, ctx: ExecutionContext) -> dict[str, Any]:
        return dump(function(**call_args(args, ctx)))

    run.__name__ = function.__name__
    return run


def _dumper(returns: Any) -> Callable[[Any], dict[str, Any]]:
    """A result becomes the JSON object callgate stores: models and dataclasses are dumped,
    a mapping passes as it is, any other value is wrapped as ``{"result": value}``."""
    adapter: TypeAdapter[Any] | None = None
    if returns not in (None, inspect.Signature.empty, Any):
        try:
            adapter = TypeAdapter(returns)
        except Exception:  # an annotation pydantic cannot model: dump by value below
            adapter = None

    def dump(value: Any) -> dict[str, Any]:
        if isinstance(value, BaseModel):
            data: Any = value.model_dump(mode="json")
        elif adapter is not None:
            data = adapter.dump_python(value, mode="json")
        else:
            data = TypeAdapter(Any).dump_python(value, mode="json")
        return dict(data) if isinstance(data, Mapping) else {"result": data}

    return dump


def _summary(docstring: str) -> str:
    """The docstring's first paragraph, on one line."""
    paragraph = docstring.strip().split("\n\n", 1)[0] if docstring.strip() else ""
    if _ARGS_HEADER.match(paragraph.splitlines()[0] if paragraph else ""):
        return ""
    return " ".join(line.strip() for line in paragraph.splitlines())


def _arg_docs(docstring: str) -> dict[str, str]:
    """Per-argument descriptions from a Google-style ``Args:`` section."""
    lines = docstring.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if _ARGS_HEADER.match(line)), None)
    docs: dict[str, str] = {}
    if start is None:
        return docs
    current: str | None = None
    indent: int | None = None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth == 0 or depth < indent:  # the next section
            break
        entry = _ARG_LINE.match(line) if depth == indent else None
        if entry:
            current = entry.group(1).lstrip("*")
            docs[current] = entry.group(3).strip()
        elif current is not None:
            docs[current] = f"{docs[current]} {line.strip()}".strip()
    return docs


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)
