"""Per-process resources of a worker: settings, engines, Redis, queue, registry."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from rq import Queue
from sqlalchemy import Engine

from callgate.store import db, transport
from callgate.store.settings import Settings
from callgate.worker import registry as tool_registry


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
            # Each call in flight runs its statements and its heartbeat on its own connection.
            engine=db.create(
                settings.require_database(),
                pool_size=settings.worker_concurrency + 2,
                application_name="callgate-worker",
            ),
            redis=connection,
            queue=transport.job_queue(connection, settings.queue),
            registry=tool_registry.from_settings(settings),
        )


_current: Runtime | None = None


def install(rt: Runtime) -> None:
    """Make ``rt`` the runtime every job of this process uses."""
    global _current
    _current = rt


def current() -> Runtime:
    """The process's runtime, built from the environment on first use."""
    if _current is None:
        install(Runtime.create(Settings.from_env()))
    assert _current is not None
    return _current
