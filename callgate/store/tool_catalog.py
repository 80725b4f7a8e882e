"""The tool catalogue in Postgres: every tool definition workers run, versioned.

Workers publish their registry's specs at start (``publish``); a producer reads them
(``for_producer``) and so needs no handler code and starts no MCP server.

A definition is named by ``(tool, version, schema_version)``, the versions the tool declares
and every call's intent carries. Publishing is one guarded statement per tool, safe with any
number of workers starting at once:

- the same definition again (same digest) records nothing new: it only refreshes the row's
  roles (the allowlist is deployment configuration, the latest start states it) and
  ``last_published_at``;
- a new definition (a version not seen before) is a new row with the tool's next
  ``revision``;
- a *different* definition under a name, version and schema version already recorded is
  refused: ``ToolDefinitionConflict`` (``tool_definition_conflict`` in its details), and
  the worker does not start. The row already there is never overwritten: bump the tool's
  ``version`` when its arguments, kind, effect or description change.

A producer reads, per tool, the definition published most recently (a rollback to an older
version is followed as soon as a worker of that version starts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Row, text
from sqlalchemy.exc import ProgrammingError

from callgate.core.errors import ConfigurationError
from callgate.core.settings import Settings
from callgate.store import db
from callgate.tools.registry import Catalog, ToolSpec, load_allowlist, load_catalog

# Attempts of a versioning statement that lost a race on the next version number: each
# round one of the racers wins, so this bounds the distinct definitions published at once.
RECORD_ATTEMPTS = 20
UNDEFINED_TABLE = "42P01"
CONFLICT = "tool_definition_conflict"
# Where a catalogue row came from: a registry's code, or an MCP server a worker started.
REGISTRY_SOURCE = "registry"
MCP_SOURCE_PREFIX = "mcp:"

# One of three answers: the row of this very definition (refreshed), the row of another
# definition under the same name and versions (a conflict), or the row just inserted with
# the tool's next revision. No row: another publisher took that revision, ask again.
PUBLISH_SQL = """
WITH same AS (
    UPDATE callgate.tool_catalog
       SET roles = CAST(:roles AS text[]), last_published_at = now()
     WHERE tool = :tool AND version = :version AND schema_version = :schema_version
       AND digest = :digest
    RETURNING revision, digest
), other AS (
    SELECT revision, digest FROM callgate.tool_catalog
     WHERE tool = :tool AND version = :version AND schema_version = :schema_version
       AND digest <> :digest
), inserted AS (
    INSERT INTO callgate.tool_catalog (tool, revision, version, schema_version, digest, kind,
                                       source, spec, roles)
    SELECT :tool,
           COALESCE((SELECT max(revision) FROM callgate.tool_catalog WHERE tool = :tool), 0) + 1,
           :version, :schema_version, :digest, :kind, :source, CAST(:spec AS jsonb),
           CAST(:roles AS text[])
     WHERE NOT EXISTS (SELECT 1 FROM callgate.tool_catalog
                        WHERE tool = :tool AND version = :version
                          AND schema_version = :schema_version)
    ON CONFLICT DO NOTHING
    RETURNING revision, digest
)
SELECT revision, digest FROM same
UNION ALL SELECT revision, digest FROM other
UNION ALL SELECT revision, digest FROM inserted
"""

LATEST_SQL = """
SELECT DISTINCT ON (tool) tool, revision, version, schema_version, digest, kind, source,
       spec, roles, published_at, last_published_at
  FROM callgate.tool_catalog
 ORDER BY tool, last_published_at DESC, revision DESC
"""


class ToolDefinitionConflict(ConfigurationError):
    """Another definition is already published under this tool's name and versions."""


@dataclass(frozen=True)
class Published:
    """One tool's row in the catalogue after a publish."""

    tool: str
    revision: int
    digest: str


def record_versioned(
    engine: Engine, statement: str, params: Mapping[str, Any], *, what: str
) -> Row[Any]:
    """Run a versioning statement until it answers a row.

    The statement returns the row an existing definition has, or inserts the next version
    number and returns it, or returns nothing when a concurrent insert took that number
    (then it is asked again). Shared by this catalogue and the MCP snapshots
    (``callgate.store.mcp_catalog``)."""
    for _ in range(RECORD_ATTEMPTS):
        with db.autocommit(engine) as conn:
            try:
                row = conn.execute(text(statement), dict(params)).first()
            except ProgrammingError as exc:
                if getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE:
                    raise ConfigurationError(
                        f"the database has no table for {what} yet: run 'callgate migrate'"
                    ) from None
                raise
        if row is not None:
            return row
    raise ConfigurationError(f"could not record a version of {what}")


def publish(
    engine: Engine, catalog: Catalog, *, sources: Mapping[str, str] | None = None
) -> list[Published]:
    """Record every tool of ``catalog`` (with the roles that allow it); raise
    ``ToolDefinitionConflict`` naming every tool whose definition differs from the one
    already recorded under its versions (the others are published)."""
    sources = sources or {}
    published: list[Published] = []
    conflicts: list[dict[str, Any]] = []
    with db.translate_errors("publishing the tool catalogue"):
        for spec in catalog.specs():
            digest = spec.digest()
            params = {
                "tool": spec.name,
                "version": spec.version,
                "schema_version": spec.schema_version,
                "digest": digest,
                "kind": spec.kind,
                "source": sources.get(spec.name, REGISTRY_SOURCE),
                "spec": json.dumps(spec.as_json()),
                "roles": catalog.roles_of(spec.name),
            }
            row = db.retry_transient(
                lambda p=params: record_versioned(  # type: ignore[misc]
                    engine, PUBLISH_SQL, p, what=f"tool {p['tool']}"
                )
            )
            if row.digest != digest:
                conflicts.append(
                    {
                        "code": CONFLICT,
                        "tool": spec.name,
                        "version": spec.version,
                        "schema_version": spec.schema_version,
                        "revision": int(row.revision),
                    }
                )
            else:
                published.append(Published(spec.name, int(row.revision), digest))
    if conflicts:
        names = ", ".join(
            f"{c['tool']} (version {c['version']!r}, schema_version {c['schema_version']!r})"
            for c in conflicts
        )
        raise ToolDefinitionConflict(
            f"{CONFLICT}: another definition is already published for {names}; a changed "
            "tool needs a new version (bump version= or schema_version=)",
            details=conflicts,
        )
    return published


def latest(engine: Engine) -> list[dict[str, Any]]:
    """The most recently published definition of each tool."""
    with db.translate_errors("reading the tool catalogue"), engine.connect() as conn:
        try:
            rows = conn.execute(text(LATEST_SQL)).mappings().all()
        except ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) == UNDEFINED_TABLE:
                raise ConfigurationError(
                    "the database has no tool catalogue yet: run 'callgate migrate'"
                ) from None
            raise
    return [dict(r) for r in rows]


def read(engine: Engine, *, mcp_only: bool = False) -> Catalog:
    """The catalogue as a producer's ``Catalog``: the latest definition of every tool (or
    of every MCP server's tool), allowed for the roles their publisher allowed."""
    rows = [r for r in latest(engine) if not mcp_only or r["source"].startswith(MCP_SOURCE_PREFIX)]
    allowlist: dict[str, list[str]] = {}
    for row in rows:
        for role in row["roles"]:
            allowlist.setdefault(role, []).append(row["tool"])
    return Catalog.of_specs((ToolSpec.from_json(r["spec"]) for r in rows), allowlist)


def for_producer(engine: Engine, settings: Settings) -> Catalog:
    """The tools a producer plans, shows and checks with; never a handler run, never an
    MCP server started.

    - ``CALLGATE_TOOLS`` unset: every tool the workers published to the catalogue.
    - ``CALLGATE_TOOLS`` set: that registry (or a ``Catalog`` of specs: a module without
      handlers), and, with ``CALLGATE_MCP_CONFIG`` set, the MCP tools workers published.

    ``CALLGATE_ALLOWLIST``, when set, replaces the allowlist."""
    if settings.tools:
        own = load_catalog(settings.tools)
        if settings.mcp_config:
            own = _merged(own, read(engine, mcp_only=True))
    else:
        own = read(engine)
    return own.with_allowlist(load_allowlist(settings.allowlist)) if settings.allowlist else own


def _merged(own: Catalog, published: Catalog) -> Catalog:
    """``own``'s tools, then the published ones it does not name."""
    tools = dict(published.tools)
    tools.update(own.tools)
    allowlist: dict[str, set[str]] = {r: set(n) for r, n in own.allowlist.items()}
    for role, names in published.allowlist.items():
        allowlist.setdefault(role, set()).update(n for n in names if n not in own.tools)
    return Catalog(tools, {r: frozenset(n) for r, n in allowlist.items()})
