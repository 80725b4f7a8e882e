"""Per-process resources of a worker: settings, engines, Redis, queue, registry."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from rq import Queue
from sqlalchemy import Engine

from callgate.core.settings import Settings
from callgate.queue import transport
from callgate.store import db
from callgate.tools import registry as tool_registry

# Connections of a worker process: K + 2 up to K = 8 (a call's statements never wait), at
# most POOL_CONNECTIONS + 2 above (the lease renewals and the consumer's own statements).
POOL_CONNECTIONS = 8


def pool_connections(concurrency: int) -> int:
    return min(concurrency, POOL_CONNECTIONS) + 2


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    engine: Engine
    redis: redis.Redis
    queue: Queue
    registry: tool_registry.Registry

    @classmethod
    def create(cls, settings: Settings) -> Runtime:
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
            registry=tool_registry.from_settings(settings),
        )


_current: Runtime | None = None


def install(rt: Runtime) -> None:
    """Nothing reads it any more: the consumer is handed its runtime, and RQ's own worker
    (which needed a process-wide one) no longer runs callgate's jobs. It goes once
    worker/process.py stops calling it."""
    global _current
    _current = rt
