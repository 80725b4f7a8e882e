"""Tools and who may call them.

A tool is data plus a handler; the gate and the executor read it, they never special-case a
tool by name. Applications point workers at their own registry with
``CALLGATE_TOOLS=module:attribute`` (a ``Registry`` or a zero-argument callable returning one).

A producer needs only each tool's ``ToolSpec`` (name, kind, versions, argument schema,
description, effect) and the allowlist: a ``Catalog``. Workers publish theirs to Postgres at
start (``callgate.store.tool_catalog``), so a producer runs with no handler code importable.
A ``Registry`` is a ``Catalog`` whose tools carry their handlers. MCP servers are started by
workers only (``callgate.worker.runtime``): nothing here imports the worker.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from callgate.core.errors import ConfigurationError, ErrorCode, StaleFence, ToolError
from callgate.core.settings import Settings
from callgate.tools import retrieval

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
    """What the tool's downstream offers against duplicates and stale owners.

    ``keys_kept_seconds``: how long the downstream remembers an idempotency key (None: as
    long as callgate may send it again). A request repeated after that is a new request to
    it, so callgate sends a key again only while the key is younger than that, less
    ``KEY_MARGIN_SECONDS``; past it, a repeat is settled as for a downstream without keys
    (the status lookup, else ``reconciliation_pending``)."""

    idempotency_keys: bool = False
    fencing: bool = False
    status_lookup: bool = False
    keys_kept_seconds: float | None = None

    def __post_init__(self) -> None:
        kept = self.keys_kept_seconds
        if kept is None:
            return
        if isinstance(kept, bool) or not isinstance(kept, int | float) or not kept > 0:
            raise ConfigurationError(
                f"Downstream(keys_kept_seconds={kept!r}): give how long the downstream keeps "
                "an idempotency key, in seconds (a number above 0), or None"
            )
        if not self.idempotency_keys:
            raise ConfigurationError(
                f"Downstream(keys_kept_seconds={kept!r}) without idempotency_keys=True: only a "
                "downstream that takes idempotency keys keeps them"
            )

    def keeps_key(self, age_seconds: float) -> bool:
        """Does the downstream still remember a key first sent ``age_seconds`` ago?"""
        if not self.idempotency_keys:
            return False
        kept = self.keys_kept_seconds
        return kept is None or age_seconds < kept - KEY_MARGIN_SECONDS


# A key is not sent again in the last minute of the time its downstream keeps it: the
# downstream's clock and PostgreSQL's differ, and a request sent now arrives a little later.
KEY_MARGIN_SECONDS = 60.0


def _refuse_read_contracts(tool: Tool) -> None:
    """A read runs with no reservation: a duplicate delivery may run it twice, and it gets
    no fence, no key kept per operation, no status lookup after a crash. A read that
    declares one of those is a write declared as a read, and would lose at-most-once."""
    declared = [
        name
        for name, on in (
            ("lookup", tool.lookup is not None),
            ("Downstream(idempotency_keys=True)", tool.downstream.idempotency_keys),
            ("Downstream(fencing=True)", tool.downstream.fencing),
            ("Downstream(status_lookup=True)", tool.downstream.status_lookup),
        )
        if on
    ]
    if declared:
        raise ConfigurationError(
            f"tool {tool.name!r} is declared kind='read' but also {', '.join(declared)}: a "
            "read may run more than once and gets no idempotency key, fence or status "
            "lookup; if it changes anything downstream, declare it kind='write'"
        )


@dataclass(frozen=True)
class ResultLimits:
    """Caps applied to every result before a model sees it."""

    max_string: int = 2_000
    max_items: int = 100
    max_depth: int = 6
    # Images a result carries as ``{"mime_type": "image/png", "data_base64": "…"}``: their
    # decoded size at most (0: none pass; see ``callgate.tools.results``).
    max_image_bytes: int = 0


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

    def __post_init__(self) -> None:
        if self.kind == "read":
            _refuse_read_contracts(self)
        if self.audit_field is not None and not (
            isinstance(self.audit_field, str) and self.audit_field
        ):
            raise ConfigurationError(
                f"tool {self.name!r}: audit_field must name one result field (a string), "
                f"not {self.audit_field!r}"
            )

    def audited(self, raw: Any) -> list[str] | None:
        """The resource ids ``audit_field`` names in a result: a list, or one id (an int
        ticket id is an id too); ``None`` when the tool names no field or it is absent."""
        if not self.audit_field or not isinstance(raw, Mapping):
            return None
        value = raw.get(self.audit_field)
        if value is None:
            return None
        return [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]

    def safe_to_repeat(self, key_age_seconds: float = 0.0) -> bool:
        """May this tool run again after an attempt that may have applied? A read, a write
        whose effect is idempotent, or one whose downstream replays an idempotency key it
        still keeps (the key was first sent ``key_age_seconds`` ago). Fencing is not enough:
        it refuses a stale owner's late write, not a second write after the first landed."""
        return (
            self.kind == "read"
            or self.effect.idempotent
            or self.downstream.keeps_key(key_age_seconds)
        )

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

    def spec(self) -> ToolSpec:
        """What a producer needs of this tool, without its handler or policy hooks."""
        return _spec_of(self)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a producer knows it: no handler, no policy hooks, plain JSON.

    Plans read ``kind`` (reads run at once, writes in order), the adapters and the model read
    ``name``, ``description`` and the ``arguments`` JSON Schema, the MCP gateway reads
    ``effect`` for its hints. ``(name, version, schema_version)`` names one definition: the
    catalogue refuses two different definitions under one name (bump ``version``).
    """

    name: str
    description: str
    arguments: Mapping[str, Any]  # a JSON Schema object
    kind: Kind
    version: str = "1"
    schema_version: str = "1"
    effect: SideEffect = SideEffect()
    policy_version: str = "1"

    def parameters(self) -> dict[str, Any]:
        return dict(self.arguments)

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters(),
        }

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["arguments"] = self.parameters()
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ToolSpec:
        return cls(
            name=doc["name"],
            description=doc["description"],
            arguments=dict(doc["arguments"]),
            kind=doc["kind"],
            version=doc["version"],
            schema_version=doc["schema_version"],
            effect=SideEffect(**doc["effect"]),
            policy_version=doc["policy_version"],
        )

    def digest(self) -> str:
        """Names this definition: equal specs, equal digests, whatever their key order."""
        text = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


class Described(Protocol):
    """What both a ``Tool`` and a ``ToolSpec`` answer: all a producer reads of a tool."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def kind(self) -> Kind: ...
    @property
    def version(self) -> str: ...
    @property
    def schema_version(self) -> str: ...
    @property
    def effect(self) -> SideEffect: ...
    @property
    def policy_version(self) -> str: ...
    def parameters(self) -> dict[str, Any]: ...
    def definition(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Catalog:
    """Tools by name and who may call them: what a producer plans, shows and checks with.

    Built from specs (``Catalog.of_specs``, the Postgres catalogue) or a ``Registry``."""

    tools: Mapping[str, Described]
    allowlist: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of_specs(cls, specs: Iterable[ToolSpec], allowlist: Mapping[str, Iterable[str]]) -> Catalog:
        by_name: dict[str, Described] = {}
        for spec in specs:
            if spec.name in by_name:
                raise ConfigurationError(f"two tools are named {spec.name!r}")
            by_name[spec.name] = spec
        return cls(by_name, {}).with_allowlist(allowlist)

    def with_allowlist(self, allowlist: Mapping[str, Iterable[str]]) -> Catalog:
        """The same tools with another role → tools allowlist (configuration)."""
        return replace(self, allowlist=_checked_allowlist(allowlist, self.tools.keys()))

    def kind_of(self, tool_name: str) -> Kind:
        """Unknown tools count as reads: the gate rejects them before anything runs."""
        tool = self.tools.get(tool_name)
        return tool.kind if tool else "read"

    def specs(self) -> list[ToolSpec]:
        """Every tool's spec, by name."""
        return [
            t if isinstance(t, ToolSpec) else _spec_of(t) for _, t in sorted(self.tools.items())
        ]

    def allowed_for(self, roles: Iterable[str]) -> frozenset[str]:
        allowed: set[str] = set()
        for role in roles:
            allowed |= self.allowlist.get(role, frozenset())
        return frozenset(allowed)

    def roles_of(self, tool_name: str) -> list[str]:
        """The roles whose allowlist names this tool."""
        return sorted(r for r, names in self.allowlist.items() if tool_name in names)

    def scope_of(self, tool_name: str, roles: Iterable[str]) -> str:
        """The roles that allow this tool, as part of an intent: a change in them is a
        change in what the call is authorised as."""
        return ",".join(sorted(r for r in roles if tool_name in self.allowlist.get(r, ())))

    def definitions_for(self, roles: Iterable[str]) -> list[dict[str, Any]]:
        """The tools a model acting for these roles may be shown: the allowlist, never more."""
        allowed = self.allowed_for(roles)
        return [t.definition() for name, t in sorted(self.tools.items()) if name in allowed]

    def select(
        self,
        query: str,
        roles: Iterable[str],
        top_k: int = retrieval.DEFAULT_TOP,
        *,
        embed: retrieval.Embed | None = None,
        embed_weight: float = retrieval.DEFAULT_EMBED_WEIGHT,
    ) -> list[Described]:
        """The ``top_k`` tools these roles may use that best match ``query`` (the user's
        request), best first: BM25 over names, descriptions and arguments (the
        ``retrieval`` extra), blended with ``embed``'s cosine similarity when given
        (``callgate.tools.retrieval``). Only allowed tools are candidates, so the result
        is always a subset of ``definitions_for(roles)``."""
        ranked = self._retrieval.rank(
            query, self.allowed_for(roles), top_k, embed=embed, embed_weight=embed_weight
        )
        return [self.tools[s.name] for s in ranked]

    @cached_property
    def _retrieval(self) -> retrieval.ToolIndex:
        # Kept on the instance: a catalog never changes, and another allowlist or set of
        # tools is another catalog (``replace``), with an index of its own.
        return retrieval.ToolIndex({n: t.definition() for n, t in self.tools.items()})


def _spec_of(tool: Described) -> ToolSpec:
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        arguments=tool.parameters(),
        kind=tool.kind,
        version=tool.version,
        schema_version=tool.schema_version,
        effect=tool.effect,
        policy_version=tool.policy_version,
    )


def _checked_allowlist(
    allowlist: Mapping[str, Iterable[str]], known: Iterable[str]
) -> dict[str, frozenset[str]]:
    names_known = set(known)
    roles: dict[str, frozenset[str]] = {}
    for role, names in allowlist.items():
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ConfigurationError(f"allowlist for role {role!r} must be a list of names")
        unknown = set(names) - names_known
        if unknown:
            raise ConfigurationError(
                f"allowlist for role {role!r} names unknown tools: {sorted(unknown)}"
            )
        roles[role] = frozenset(names)
    return roles


@dataclass(frozen=True)
class Registry(Catalog):
    """A catalog whose tools carry their handlers: what a worker runs.

    ``downstream_schema`` names the schema these tools' own downstream needs, an entry point
    in the ``callgate.downstreams`` group: ``callgate up`` installs it beside callgate's
    tables (the demo's tools declare ``"demo"``). None: the application manages its own."""

    tools: Mapping[str, Tool]
    downstream_schema: str | None = None

    @classmethod
    def of(
        cls,
        tools: Iterable[Tool],
        allowlist: Mapping[str, Iterable[str]],
        *,
        downstream_schema: str | None = None,
    ) -> Registry:
        by_name: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in by_name:
                raise ConfigurationError(f"two tools are named {tool.name!r}")
            by_name[tool.name] = tool
        return cls(by_name, {}, downstream_schema).with_allowlist(allowlist)

    def with_allowlist(self, allowlist: Mapping[str, Iterable[str]]) -> Registry:
        """The same tools with another role → tools allowlist (configuration)."""
        return replace(self, allowlist=_checked_allowlist(allowlist, self.tools.keys()))

    def require(self, tool_name: str) -> Tool:
        tool = self.tools.get(tool_name)
        if tool is None:
            raise ToolError(f"no tool named {tool_name!r}", code=ErrorCode.UNKNOWN_TOOL)
        return tool


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


_C = TypeVar("_C", bound=Catalog)

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


def load_catalog(spec: str) -> Catalog:
    """A producer's ``CALLGATE_TOOLS``: a ``Registry``, or a ``Catalog`` of ``ToolSpec``s (a
    module that holds no handler code), or a zero-argument callable returning one."""
    return _load_target(spec, Catalog, "a callgate.tools.registry.Catalog or Registry")


def _load_registry(spec: str | None) -> Registry:
    if not spec or not spec.strip():
        raise ConfigurationError(MISSING_REGISTRY)
    return _load_target(spec, Registry, "a callgate.tools.registry.Registry")


def _load_target(spec: str, kind: type[_C], expected: str) -> _C:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"CALLGATE_TOOLS={spec!r}: expected 'module:attribute'")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except ModuleNotFoundError as exc:
        if exc.name is None or not _names_module(module_name, exc.name):
            raise ConfigurationError(f"CALLGATE_TOOLS={spec!r}: {exc}") from exc
        raise ConfigurationError(_not_found(spec, exc.name)) from None
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"CALLGATE_TOOLS={spec!r}: {exc}") from exc
    loaded = target() if callable(target) and not isinstance(target, Catalog) else target
    if not isinstance(loaded, kind):
        raise ConfigurationError(f"CALLGATE_TOOLS={spec!r} is not {expected}")
    return loaded


def _names_module(module_name: str, missing: str) -> bool:
    """Whether the module missing is the one named (or a package on its way), rather than
    something that module imports, which is a missing dependency, not a search-path problem."""
    return module_name == missing or module_name.startswith(missing + ".")


def _own_directories() -> list[str]:
    """The import path without the interpreter's own entries (standard library, its zip,
    site-packages): the directories a user's module could be in."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    own = []
    for entry in sys.path:
        real = os.path.realpath(entry or ".")
        if (
            real.endswith(".zip")
            or real == stdlib
            or real.startswith(stdlib + os.sep)
            or {"site-packages", "dist-packages"} & set(Path(real).parts)
        ):
            continue
        if os.path.isdir(real):
            own.append(real)
    return own


def _not_found(spec: str, missing: str) -> str:
    searched = ", ".join(_own_directories()) or "no directory of your own"
    return (
        f"CALLGATE_TOOLS={spec!r}: no module named {missing!r} in {searched} (nor installed): "
        f"run callgate from the directory that holds {missing.replace('.', '/')}.py, or pass "
        "callgate --path DIR, or install the module"
    )


def from_env(env: Mapping[str, str] | None = None) -> Registry:
    """The registry named by ``CALLGATE_TOOLS``, with ``CALLGATE_ALLOWLIST`` applied. MCP
    servers' tools are the worker's to add (``callgate.worker.runtime.load_registry``)."""
    return from_settings(Settings.from_env(env))


def from_settings(settings: Settings) -> Registry:
    """The registry these settings name (``CALLGATE_TOOLS``, ``CALLGATE_ALLOWLIST``), without
    the MCP servers' tools (only a worker starts those servers)."""
    return load(settings.tools, settings.allowlist)
