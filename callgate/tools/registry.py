"""Tools and who may call them.

A tool is data plus a handler; the gate and the executor read it, they never special-case a
tool by name. Applications point workers and producers at their own registry with
``CALLGATE_TOOLS=module:attribute`` (a ``Registry`` or a zero-argument callable returning one).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from callgate.core.errors import ConfigurationError, ErrorCode, StaleFence, ToolError
from callgate.core.settings import Settings

Kind = Literal["read", "write"]
Arguments = BaseModel | dict[str, Any]  # a validated model, or a dict checked by JSON Schema


@dataclass(frozen=True)
class Principal:
    """Who asks, from the server-trusted context of the turn. Never from model arguments."""

    tenant_id: str
    user_id: str
    roles: tuple[str, ...]


@dataclass(frozen=True)
class Facts:
    """Server state a tool's policy reads before deciding (business, authorization, risk).

    ``canonical`` identifies the resource the call acts on (the payment behind an order, the
    exact set of e-mails behind a query); it is part of the intent hash, so if it changes
    after an approval, the approval no longer applies. ``state`` is what the rules check
    (remaining refundable amount, owner tenant); it may change and is not part of the intent.
    """

    canonical: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecutionContext:
    """What a handler may know about the call it runs. Server-owned values only."""

    tenant_id: str
    user_id: str
    operation_id: str
    idempotency_key: str
    fencing_token: int
    request_id: str
    canonical: Mapping[str, Any] = field(default_factory=dict)
    # True once this worker can no longer count on its lease (see ``ensure_lease``).
    lease_lost: Callable[[], bool] = field(default=lambda: False)
    # The worker's side-effect count (callgate_side_effects_total), fed by ``report_effect``.
    on_effect: Callable[[bool], None] = field(default=lambda applied: None, repr=False)
    # What the handler reported, in order: the worker reads it once the handler returns.
    effects: list[bool] = field(default_factory=list, repr=False, compare=False, hash=False)

    def report_effect(self, applied: bool) -> None:
        """Say what the downstream answered to this write: ``applied=True`` when it applied
        the request now, ``False`` when it replayed an earlier answer for this idempotency
        key (or changed nothing). Call it as soon as the answer arrives.

        The worker counts ``callgate_side_effects_total`` from it. A write whose handler
        returns without reporting counts one side effect per successful run, so a
        downstream that deduplicates should report its replays."""
        self.effects.append(applied)
        self.on_effect(applied)

    def ensure_lease(self) -> None:
        """Raise ``StaleFence`` if another worker may have taken this operation over.

        Call it before a downstream write that follows long work, above all CPU-bound work
        that holds the GIL (the lease renewal thread cannot run meanwhile)."""
        if self.lease_lost():
            raise StaleFence("this worker's lease on the operation has run out")


Handler = Callable[[Any, ExecutionContext], dict[str, Any]]
# Policy hooks. Only ``resolve`` may do I/O (a status lookup); the others are pure decisions
# over the validated arguments, the facts and the principal, and raise ``ToolError``.
Resolver = Callable[[Any, Principal], Facts]
BusinessRule = Callable[[Any, Facts, Principal], None]
Authorizer = Callable[[Any, Facts, Principal], None]
RiskPolicy = Callable[[Any, Facts, Principal], "dict[str, Any] | None"]
# The downstream's status lookup for one write, by its idempotency key: the result the write
# produced if it applied, None if it did not; raises if it cannot tell.
StatusLookup = Callable[[Any, ExecutionContext], "dict[str, Any] | None"]


@dataclass(frozen=True)
class SideEffect:
    """What running the tool does to the world (retry idempotency ≠ business idempotency).

    Unsafe is the default: ``SideEffect()`` (and a tool that declares no effect) is
    irreversible and not idempotent, so forgetting to declare a write never lets a worker
    run it a second time after a crash. Reads say so with ``READ_ONLY``.
    """

    idempotent: bool = False  # applying it twice means the same as once
    reversible: bool = False


READ_ONLY = SideEffect(idempotent=True, reversible=True)


@dataclass(frozen=True)
class Downstream:
    """What the tool's downstream offers against duplicates and stale owners."""

    idempotency_keys: bool = False
    fencing: bool = False
    status_lookup: bool = False


@dataclass(frozen=True)
class ResultLimits:
    """Caps applied to every result before a model sees it."""

    max_string: int = 2_000
    max_items: int = 100
    max_depth: int = 6


@dataclass(frozen=True)
class Tool:
    """A tool: data plus a handler and optional policy hooks.

    ``arguments`` is a pydantic model (extra fields forbidden) or a JSON Schema object, for
    tools discovered at run time (MCP). ``result`` is a pydantic model naming the fields a
    model may see (unknown fields are dropped); without it the result passes as returned,
    still redacted and capped. ``audit_field`` names the result field listing the resource
    ids the call changed; the trace links each of them to the call. ``lookup`` settles a
    write that may have applied (its worker died in the crash gap, it timed out after the
    request left): given the arguments and the context (its idempotency key), it returns the
    write's result if it applied, ``None`` if it did not, and raises if it cannot tell.
    Without one, such a write whose downstream takes no idempotency key ends
    ``reconciliation_pending``. ``effect`` defaults to the most dangerous kind (irreversible,
    not idempotent); declare ``READ_ONLY`` for reads.
    """

    name: str
    description: str
    arguments: type[BaseModel] | Mapping[str, Any]
    kind: Kind
    handler: Handler
    version: str = "1"
    schema_version: str = "1"
    effect: SideEffect = SideEffect()
    downstream: Downstream = Downstream()
    result: type[BaseModel] | None = None
    limits: ResultLimits = ResultLimits()
    audit_field: str | None = None
    resolve: Resolver | None = None
    lookup: StatusLookup | None = None
    validate: BusinessRule | None = None
    authorize: Authorizer | None = None
    risk: RiskPolicy | None = None
    policy_version: str = "1"

    def parameters(self) -> dict[str, Any]:
        """The arguments' JSON Schema, as a model is shown it."""
        if isinstance(self.arguments, Mapping):
            return dict(self.arguments)
        return self.arguments.model_json_schema()

    def definition(self) -> dict[str, Any]:
        """Provider-neutral definition: ``{name, description, parameters}``."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters(),
        }


@dataclass(frozen=True)
class Registry:
    tools: Mapping[str, Tool]
    allowlist: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Iterable[Tool], allowlist: Mapping[str, Iterable[str]]) -> Registry:
        by_name: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in by_name:
                raise ConfigurationError(f"two tools are named {tool.name!r}")
            by_name[tool.name] = tool
        return cls(by_name, {}).with_allowlist(allowlist)

    def with_allowlist(self, allowlist: Mapping[str, Iterable[str]]) -> Registry:
        """The same tools with another role → tools allowlist (configuration)."""
        roles: dict[str, frozenset[str]] = {}
        for role, names in allowlist.items():
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise ConfigurationError(f"allowlist for role {role!r} must be a list of names")
            unknown = set(names) - self.tools.keys()
            if unknown:
                raise ConfigurationError(
                    f"allowlist for role {role!r} names unknown tools: {sorted(unknown)}"
                )
            roles[role] = frozenset(names)
        return replace(self, allowlist=roles)

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

    def scope_of(self, tool_name: str, roles: Iterable[str]) -> str:
        """The roles that allow this tool, as part of an intent: a change in them is a
        change in what the call is authorised as."""
        return ",".join(sorted(r for r in roles if tool_name in self.allowlist.get(r, ())))

    def definitions_for(self, roles: Iterable[str]) -> list[dict[str, Any]]:
        """The tools a model acting for these roles may be shown: the allowlist, never more."""
        allowed = self.allowed_for(roles)
        return [t.definition() for name, t in sorted(self.tools.items()) if name in allowed]


def load_allowlist(value: str) -> dict[str, list[str]]:
    """``CALLGATE_ALLOWLIST``: a JSON object ``{role: [tool, …]}``, inline or in a file."""
    text = value.strip()
    source = "CALLGATE_ALLOWLIST"
    if not text.startswith(("{", "[")):
        path = Path(text)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigurationError(f"{source}={value!r}: cannot read file ({exc})") from None
        source = f"{source} file {path}"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{source} is not valid JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, list) for v in doc.values()):
        raise ConfigurationError(f"{source} must be a JSON object {{role: [tool, ...]}}")
    return doc


MISSING_REGISTRY = (
    "CALLGATE_TOOLS is not set: name your tool registry as 'module:attribute' (a "
    "callgate.tools.registry.Registry or a zero-argument callable returning one), e.g. "
    "CALLGATE_TOOLS=callgate.ops.lab.demo.tools:demo_registry for the demo tools"
)


def load(spec: str | None, allowlist: str | None = None) -> Registry:
    """Load ``module:attribute``; a missing ``spec`` is a ``ConfigurationError`` (never a
    fallback to the demo tools). ``allowlist`` (``CALLGATE_ALLOWLIST``), when given,
    replaces the registry's own role allowlists."""
    registry = _load_registry(spec)
    return registry.with_allowlist(load_allowlist(allowlist)) if allowlist else registry


def _load_registry(spec: str | None) -> Registry:
    if not spec or not spec.strip():
        raise ConfigurationError(MISSING_REGISTRY)
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


def from_env(env: Mapping[str, str] | None = None) -> Registry:
    """The registry named by ``CALLGATE_TOOLS``, with ``CALLGATE_ALLOWLIST`` applied (and
    the MCP servers' tools when ``CALLGATE_MCP_CONFIG`` is set)."""
    import os

    env = os.environ if env is None else env
    if env.get("CALLGATE_MCP_CONFIG"):
        return from_settings(Settings.from_env(dict(env)))
    return load(env.get("CALLGATE_TOOLS") or None, env.get("CALLGATE_ALLOWLIST") or None)


def from_settings(settings: Settings) -> Registry:
    """The registry these settings name (``CALLGATE_TOOLS``, ``CALLGATE_ALLOWLIST``), with
    the tools of the MCP servers ``CALLGATE_MCP_CONFIG`` names (``callgate.worker.mcp``)."""
    if not settings.mcp_config:
        return load(settings.tools, settings.allowlist)
    try:
        from callgate.worker.mcp.hub import with_mcp_tools
    except ImportError as exc:
        raise ConfigurationError(
            f"CALLGATE_MCP_CONFIG is set but the MCP SDK is missing ({exc.name}): "
            "pip install 'callgate[mcp]'"
        ) from None

    registry = with_mcp_tools(_load_registry(settings.tools), settings)
    return (
        registry.with_allowlist(load_allowlist(settings.allowlist))
        if settings.allowlist
        else registry
    )
