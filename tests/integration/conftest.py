"""Fixtures for the integration tier: a producer on the session's database and a private
queue, and a count of what submit stored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.lab.demo.tools import demo_registry
from callgate.producer import Producer
from callgate.queue import transport
from callgate.store import db


@pytest.fixture
def producer(database_url: str, redis_url: str, queue_name: str) -> Iterator[Producer]:
    settings = Settings.from_env(
        {
            "CALLGATE_DATABASE_URL": database_url,
            "CALLGATE_REDIS_URL": redis_url,
            "CALLGATE_QUEUE": queue_name,
        }
    )
    p = Producer(
        settings=settings,
        engine=db.create(database_url),
        redis_connection=transport.connect(redis_url),
        registry=demo_registry(),
    )
    yield p
    p.close()


def stored(engine: Engine) -> tuple[int, int, int]:
    """Rows of turns, calls and operations: what a refused submit must leave unchanged."""
    with engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(text(f"SELECT count(*) FROM callgate.{t}")).scalar_one())
            for t in ("turns", "calls", "operations")
        )
