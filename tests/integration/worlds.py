"""A worker's runtime and a producer on the same services and registry, in this process:
``executor.execute(rt, ref)`` is then one real delivery of a call ``producer`` submitted."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from sqlalchemy import Engine, text

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


def submit_one(
    producer: Producer, tool: str, arguments: dict[str, Any], context: dict[str, Any]
) -> tuple[uuid.UUID, str]:
    """Submit one call; its ref and operation id."""
    turn = producer.submit([{"call_id": "c1", "tool_name": tool, "arguments": arguments}], context)
    (call,) = turn.calls
    return uuid.UUID(call.ref), call.operation_id


def call_row(engine: Engine, ref: uuid.UUID) -> Any:
    """The call's state and result, as Postgres holds them."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT state, result FROM callgate.calls WHERE id = :r"), {"r": ref}
        ).one()


def lease_expired(engine: Engine, operation_id: str) -> bool:
    """Whether the operation's lease has run out, on Postgres' clock."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT lease_expires_at < now() FROM callgate.operations"
                    " WHERE operation_id = :o"
                ),
                {"o": operation_id},
            ).scalar_one()
        )
