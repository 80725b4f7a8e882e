"""Tools and who may call them.

A tool is data plus a handler; the gate and the executor read it, they never special-case a
tool by name. Applications point workers and producers at their own registry with
``CALLGATE_TOOLS=module:attribute`` (a ``Registry`` or a zero-argument callable returning one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from store.errors import ConfigurationError, ErrorCode, ToolError

Kind = Literal["read", "write"]


@dataclass(frozen=True)
class ExecutionContext:
    """What a handler may know about the call it runs. Server-owned values only."""

    tenant_id: str
    user_id: str
    operation_id: str
    idempotency_key: str
    fencing_token: int
    request_id: str


Handler = Callable[[BaseModel, ExecutionContext], dict[str, Any]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[BaseModel]
    kind: Kind
    handler: Handler
    version: str = "1"
    schema_version: str = "1"


@dataclass(frozen=True)
class Registry:
    tools: Mapping[str, Tool]
    allowlist: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Iterable[Tool], allowlist: Mapping[str, Iterable[str]]) -> Registry:
        by_name = {t.name: t for t in tools}
        for role, names in allowlist.items():
            unknown = set(names) - by_name.keys()
            if unknown:
                raise ConfigurationError(
                    f"allowlist for role {role!r} names unknown tools: {sorted(unknown)}"
                )
        return cls(by_name, {role: frozenset(names) for role, names in allowlist.items()})

    def kind_of(self, tool_name: str) -> Kind:
        """Unknown tools count as reads: the gate rejects them before anything runs."""
        tool = self.tools.get(tool_name)
        return tool.kind if tool else "read"

    def require(self, tool_name: str) -> Tool:
        tool = self.tools.get(tool_name)
        if tool is None:
            raise ToolError(f"no tool named {tool_name!r}", code=ErrorCode.UNKNOWN_TOOL)
        return tool

    def allowed_for(self, roles: Iterable[str]) -> frozenset[str]:
        allowed: set[str] = set()
        for role in roles:
            allowed |= self.allowlist.get(role, frozenset())
        return frozenset(allowed)


def load(spec: str | None) -> Registry:
    """Load ``module:attribute``; the demo registry when ``spec`` is empty."""
    if not spec:
        from worker.demo.tools import demo_registry

        return demo_registry()
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"CALLGATE_TOOLS={spec!r}: expected 'module:attribute'")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"CALLGATE_TOOLS={spec!r}: {exc}") from exc
    registry = target() if callable(target) and not isinstance(target, Registry) else target
    if not isinstance(registry, Registry):
        raise ConfigurationError(f"CALLGATE_TOOLS={spec!r} is not a worker.registry.Registry")
    return registry
