"""MCP tool snapshots in Postgres: each tool's definition, versioned.

``record`` stores what a server published for each tool and returns the tool's version:
the version an identical definition already has, or the next one. One guarded statement per
tool, so processes that discover the same server at once agree on the numbers (the loser of
a race on a version number asks again: ``tool_catalog.record_versioned``, shared with the
tool catalogue, which records the callgate tools built from these definitions). ``latest``
reads the newest version of each tool.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

from callgate.store import db
from callgate.store.tool_catalog import record_versioned

RECORD_SQL = """
WITH existing AS (
    SELECT version FROM callgate.mcp_tools
     WHERE server = :server AND tool = :tool AND digest = :digest
), inserted AS (
    INSERT INTO callgate.mcp_tools (server, tool, version, digest, description, input_schema,
                                    output_schema, annotations, server_name, server_version,
                                    protocol_version)
    SELECT :server, :tool,
           COALESCE((SELECT max(version) FROM callgate.mcp_tools
                      WHERE server = :server AND tool = :tool), 0) + 1,
           :digest, :description, CAST(:input_schema AS jsonb), CAST(:output_schema AS jsonb),
           CAST(:annotations AS jsonb), :server_name, :server_version, :protocol_version
     WHERE NOT EXISTS (SELECT 1 FROM existing)
    ON CONFLICT DO NOTHING
    RETURNING version
)
SELECT version FROM existing UNION ALL SELECT version FROM inserted
"""

LATEST_SQL = """
SELECT DISTINCT ON (server, tool) server, tool, version, digest, description, input_schema,
       output_schema, annotations, server_name, server_version, protocol_version, discovered_at
  FROM callgate.mcp_tools
 WHERE CAST(:server AS text) IS NULL OR server = :server
 ORDER BY server, tool, version DESC
"""


@dataclass(frozen=True)
class Definition:
    """One tool as a server published it, with the digest that names this definition."""

    tool: str
    digest: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any] | None


@dataclass(frozen=True)
class ServerInfo:
    """What ``initialize`` said about the server."""

    name: str | None
    version: str | None
    protocol_version: str | None


def record(
    engine: Engine, server: str, info: ServerInfo, definitions: Sequence[Definition]
) -> dict[str, int]:
    """Store each definition (once per digest) and return ``{tool: version}``."""
    versions: dict[str, int] = {}
    with db.translate_errors("recording MCP tools"):
        for definition in definitions:
            versions[definition.tool] = db.retry_transient(
                lambda d=definition: _record_one(engine, server, info, d)  # type: ignore[misc]
            )
    return versions


def _record_one(engine: Engine, server: str, info: ServerInfo, d: Definition) -> int:
    params = {
        "server": server,
        "tool": d.tool,
        "digest": d.digest,
        "description": d.description,
        "input_schema": json.dumps(d.input_schema),
        "output_schema": None if d.output_schema is None else json.dumps(d.output_schema),
        "annotations": None if d.annotations is None else json.dumps(d.annotations),
        "server_name": info.name,
        "server_version": info.version,
        "protocol_version": info.protocol_version,
    }
    row = record_versioned(engine, RECORD_SQL, params, what=f"MCP tool {server}/{d.tool}")
    return int(row.version)


def latest(engine: Engine, server: str | None = None) -> list[dict[str, Any]]:
    """The newest version of each recorded tool (of one server, or of all)."""
    with db.translate_errors("reading MCP tools"), engine.connect() as conn:
        rows = conn.execute(text(LATEST_SQL), {"server": server}).mappings().all()
    return [dict(r) for r in rows]
