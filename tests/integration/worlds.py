"""A worker's runtime and a producer on the same services and registry, in this process:
``executor.execute(rt, ref)`` is then one real delivery of a call ``producer`` submitted."""

from __future__ import annotations

import redis
from sqlalchemy import Engine

from callgate.core.settings import Settings
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db
from callgate.tools.registry import Registry
from callgate.worker.runtime import Runtime


def in_process(
    database_url: str, redis_url: str, queue_name: str, registry: Registry, **env: str
) -> tuple[Runtime, Producer, Engine]:
    """``env``: more CALLGATE_ settings (leases, retries) for both."""
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
            **env,
        }
    )
    engine = db.create(database_url, pool_size=4)
    connection = transport.connect(redis_url)
    rt = Runtime(
        settings=settings,
        engine=engine,
        redis=redis.Redis.from_url(redis_url),
        queue=transport.job_queue(connection, settings.queue),
        registry=registry,
    )
    producer = Producer(
        settings=settings, engine=engine, redis_connection=connection, registry=registry
    )
    return rt, producer, engine
