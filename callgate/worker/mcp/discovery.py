"""Discovery: every tool a server lists, and the definition callgate keeps of each.

``list_tools`` follows ``nextCursor`` through every page (a cursor seen twice, or more than
``MAX_PAGES`` pages, ends the listing: a server cannot keep a worker listing forever).
``definition`` turns one listed tool into the definition the catalog versions: its digest
covers what a call depends on (input schema, output schema, annotations) and the server's
version, so any change to them is a new version.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import mcp_types as types
from mcp import ClientSession

from callgate.store.mcp_catalog import Definition, ServerInfo

log = logging.getLogger("callgate.mcp")

MAX_PAGES = 100


async def list_tools(session: ClientSession) -> list[types.Tool]:
    """``tools/list``, every page."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
        if cursor in seen:
            log.warning("an MCP server repeated a tools/list cursor; listing stopped there")
            return tools
        seen.add(cursor)
    log.warning("an MCP server listed more than %d pages of tools; the rest is ignored", MAX_PAGES)
    return tools


def definition(tool: types.Tool, info: ServerInfo) -> Definition:
    """What callgate keeps of one listed tool."""
    annotations = (
        tool.annotations.model_dump(by_alias=True, mode="json", exclude_none=True)
        if tool.annotations is not None
        else None
    )
    input_schema = dict(tool.input_schema)
    output_schema = dict(tool.output_schema) if tool.output_schema is not None else None
    digest = _digest(
        {
            "inputSchema": input_schema,
            "outputSchema": output_schema,
            "annotations": annotations,
            "serverVersion": info.version,
        }
    )
    return Definition(
        tool=tool.name,
        digest=digest,
        description=tool.description or tool.title or "",
        input_schema=input_schema,
        output_schema=output_schema,
        annotations=annotations,
    )


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
