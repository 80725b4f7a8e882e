"""The MCP servers of one process, and the tools they offer now.

``with_mcp_tools`` is the worker's hook (``callgate.worker.runtime.load_registry``; a
producer never starts a server, it reads the catalogue workers publish): it starts (once per
process) a connection to every configured server on the tool event loop, waits for each to
be initialised and listed, and returns the registry with their tools added. The set is
live: a server's ``notifications/tools/list_changed``, or its restart, replaces its tools
(each change a new version in the catalog) without restarting the worker. Roles a
server's ``roles`` names are allowed the tools it offered at start; a tool that appears
later must be named in ``CALLGATE_ALLOWLIST``, or wait for the next start (discovery is not
permission).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping

from callgate.core.errors import ConfigurationError
from callgate.core.settings import Settings
from callgate.store import db, mcp_catalog
from callgate.store.db import Engine
from callgate.tools.registry import Registry, Tool
from callgate.worker import aio
from callgate.worker.mcp import config as mcp_config
from callgate.worker.mcp import discovery, tools
from callgate.worker.mcp.client import Connection, Listing

log = logging.getLogger("callgate.mcp")

START_GRACE_SECONDS = 5.0
STOP_SECONDS = 10.0


class Hub:
    """Every configured server's connection in this process, and the tools they offer."""

    def __init__(self, config: mcp_config.McpConfig, database_url: str | None) -> None:
        self.config = config
        self.engine: Engine | None = (
            db.create(database_url, pool_size=2, application_name="callgate-mcp")
            if database_url
            else None
        )
        self.connections: dict[str, Connection] = {}
        self._by_server: dict[str, dict[str, Tool]] = {}
        self.tools: Mapping[str, Tool] = {}  # replaced whole, never changed in place
        self._reserved: frozenset[str] = frozenset()
        self._started = False
        self._lock = threading.Lock()

    def start(self, reserved: Iterable[str]) -> None:
        """Connect to every server and list its tools; names in ``reserved`` (the
        application's own tools) are never taken by an MCP tool."""
        with self._lock:
            if self._started:
                return
            self._reserved = frozenset(reserved)
            aio.call(self._start)
            self._started = True
            atexit.register(self.close)

    def tools_of(self, server: str) -> list[str]:
        """The names of the tools ``server`` offers now."""
        return sorted(self._by_server.get(server, {}))

    def close(self) -> None:
        """Stop every server of this process."""
        if self._started:
            self._started = False
            aio.call(self._stop)
        if self.engine is not None:
            self.engine.dispose()

    async def _start(self) -> None:
        for server in self.config.servers.values():
            connection = Connection(server, self._on_listing)
            self.connections[server.name] = connection
            connection.start()
        waits = [
            asyncio.wait_for(c.first_attempt(), c.config.connect_timeout + START_GRACE_SECONDS)
            for c in self.connections.values()
        ]
        await asyncio.gather(*waits, return_exceptions=True)

    async def _stop(self) -> None:
        stops = [c.stop() for c in self.connections.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), STOP_SECONDS)
        except TimeoutError:
            log.warning("MCP servers did not stop within %gs", STOP_SECONDS)

    async def _on_listing(self, connection: Connection, listing: Listing) -> None:
        server = connection.config
        definitions = [discovery.definition(t, listing.info) for t in listing.tools]
        if self.engine is not None:
            versions = await asyncio.to_thread(
                mcp_catalog.record, self.engine, server.name, listing.info, definitions
            )
            schema_versions = {tool: str(v) for tool, v in versions.items()}
        else:
            schema_versions = {d.tool: f"sha256:{d.digest[:16]}" for d in definitions}
        built: dict[str, Tool] = {}
        for definition in definitions:
            tool = tools.build(
                server,
                definition,
                schema_version=schema_versions[definition.tool],
                info=listing.info,
                connection=connection,
                engine=self.engine,
            )
            if tool is None:
                continue
            if tool.name in self._reserved or tool.name in built:
                log.warning("MCP tool %r: the name is taken; not offered", tool.name)
                continue
            built[tool.name] = tool
        self._by_server[server.name] = built
        merged: dict[str, Tool] = {}
        for offered in self._by_server.values():
            merged.update(offered)
        self.tools = merged
        log.info(
            "MCP server %r (%s %s, protocol %s): %d tool(s)",
            server.name,
            listing.info.name,
            listing.info.version,
            listing.info.protocol_version,
            len(built),
        )


class LiveTools(Mapping[str, Tool]):
    """The application's own tools, then the MCP tools the hub offers at this moment."""

    def __init__(self, own: Mapping[str, Tool], hub: Hub) -> None:
        self._own = own
        self._hub = hub

    def __getitem__(self, name: str) -> Tool:
        if name in self._own:
            return self._own[name]
        return self._hub.tools[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._own
        yield from (n for n in self._hub.tools if n not in self._own)

    def __len__(self) -> int:
        return len(self._own) + sum(1 for n in self._hub.tools if n not in self._own)


_hubs: dict[tuple[str, str | None], Hub] = {}
_hubs_lock = threading.Lock()


def shared(config: mcp_config.McpConfig, database_url: str | None) -> Hub:
    """This process's hub for this configuration (one per file and database)."""
    key = (config.source, database_url)
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None:
            hub = _hubs[key] = Hub(config, database_url)
        return hub


def close_all() -> None:
    """Stop every server this process started (also done at exit)."""
    with _hubs_lock:
        hubs = list(_hubs.values())
        _hubs.clear()
    for hub in hubs:
        hub.close()


def with_mcp_tools(registry: Registry, settings: Settings) -> tuple[Registry, dict[str, list[str]]]:
    """``registry`` with the tools of the servers ``CALLGATE_MCP_CONFIG`` names, and the
    names each server offered at start (the worker publishes them to the catalogue).

    Every server must answer at start: one that does not is ``invalid_configuration``
    naming it (a worker never starts with part of its tools missing).
    """
    assert settings.mcp_config is not None
    config = mcp_config.load(settings.mcp_config)
    hub = shared(config, settings.database_url)
    hub.start(reserved=registry.tools.keys())
    failed = {n: c.failure for n, c in hub.connections.items() if c.connections == 0}
    if failed:
        name, why = sorted(failed.items())[0]
        raise ConfigurationError(
            f"{config.source}: mcpServers.{name} did not start: {why or 'no answer'}"
        )
    allowlist: dict[str, set[str]] = {r: set(n) for r, n in registry.allowlist.items()}
    offered = {server: hub.tools_of(server) for server in config.servers}
    for server in config.servers.values():
        for role in server.roles:
            allowlist.setdefault(role, set()).update(offered[server.name])
    return Registry(LiveTools(registry.tools, hub)).with_allowlist(allowlist), offered
