"""Per-process resources of a worker: settings, engines, Redis, queue, registry.

Only a worker loads handler code and starts MCP servers (``load_registry``); a producer reads
the specs workers publish (``callgate.store.tool_catalog``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis
from rq import Queue

from callgate.core.errors import ConfigurationError
from callgate.core.settings import Settings
from callgate.queue import transport
from callgate.store import db
from callgate.store.db import Engine
from callgate.store.tool_catalog import MCP_SOURCE_PREFIX
from callgate.tools import registry as tool_registry

# Connections of a worker process: K + 2 up to K = 8 (a call's statements never wait), at
# most POOL_CONNECTIONS + 2 above (the lease renewals and the consumer's own statements).
POOL_CONNECTIONS = 8


def pool_connections(concurrency: int) -> int:
    return min(concurrency, POOL_CONNECTIONS) + 2


class HeldResults:
    """The results this process holds that PostgreSQL has not taken yet: a write's handler
    returned (it may have applied) and its completion is still being committed. A stopping
    worker waits for these past its grace period, while their leases may still be theirs:
    exiting would drop a result that exists nowhere else."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.count = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._changed:
            self.count += 1
        try:
            yield
        finally:
            with self._changed:
                self.count -= 1
                self._changed.notify_all()

    def wait_released(self, deadline: float) -> int:
        """Wait until none is held or ``deadline`` (monotonic) passes; the count left."""
        with self._changed:
            while self.count and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return self.count


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    engine: Engine
    redis: redis.Redis
    queue: Queue
    registry: tool_registry.Registry
    # Tool name → where it came from, for the catalogue: an MCP server's tools only.
    tool_sources: Mapping[str, str] = field(default_factory=dict)
    held: HeldResults = field(default_factory=HeldResults)

    @classmethod
    def create(cls, settings: Settings) -> Runtime:
        registry, sources = load_registry(settings)
        connection = transport.connect(settings.require_redis())
        return cls(
            settings=settings,
            # A call holds a connection only while one of its statements runs (a few ms of
            # a call that mostly waits on its tool), so K calls in flight share a few: a new
            # connection costs Postgres ~9 ms of CPU (a backend, its caches, the statements
            # prepared again), and K + 2 of them per process were most of Postgres' work
            # for a burst of short calls. A statement waits for a free connection when
            # POOL_CONNECTIONS + 2 are busy; nothing holds one while it waits for another.
            engine=db.create(
                settings.require_database(),
                pool_size=pool_connections(settings.worker_concurrency),
                max_overflow=0,
                application_name="callgate-worker",
            ),
            redis=connection,
            queue=transport.job_queue(connection, settings.queue),
            registry=registry,
            tool_sources=sources,
        )


def load_registry(settings: Settings) -> tuple[tool_registry.Registry, dict[str, str]]:
    """The registry ``CALLGATE_TOOLS`` names, with the tools of the MCP servers
    ``CALLGATE_MCP_CONFIG`` names (started here, once per process), then
    ``CALLGATE_ALLOWLIST`` applied; and each MCP tool's source (``mcp:SERVER``)."""
    if not settings.mcp_config:
        return tool_registry.load(settings.tools, settings.allowlist), {}
    # Imported only here: the MCP SDK is nearly half of a worker's start-up imports.
    try:  # the mcp extra: without it a worker runs its own tools, and refuses an MCP config
        from callgate.worker.mcp import hub as mcp_hub
    except ImportError as exc:
        raise ConfigurationError(
            f"CALLGATE_MCP_CONFIG is set but the MCP SDK is missing ({exc.name}): "
            "pip install 'callgate[mcp]'"
        ) from None
    registry, servers = mcp_hub.with_mcp_tools(tool_registry.load(settings.tools), settings)
    sources = {
        name: f"{MCP_SOURCE_PREFIX}{server}" for server, names in servers.items() for name in names
    }
    if settings.allowlist:
        registry = registry.with_allowlist(tool_registry.load_allowlist(settings.allowlist))
    return registry, sources
