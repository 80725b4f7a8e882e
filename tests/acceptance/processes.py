"""Real process-level failures for acceptance tests: a private Redis server to flush, stop
and restart, and Postgres backends to terminate.

Tests that flush Redis use a redis-server of their own, so a flush never reaches the shared
server other tests use.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from callgate.ops.lab.chaos.services import OwnedRedis


class PrivateRedis(OwnedRedis):
    """A redis-server process owned by one test (the chaos runner's own kind)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is required for this test")
        super().__init__(binary=binary)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()


def terminate_backends(engine: Engine, application_name: str) -> int:
    """pg_terminate_backend every session of one application (e.g. callgate-worker)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = :a AND datname = current_database()"
                    " AND pid <> pg_backend_pid()"
                ),
                {"a": application_name},
            ).scalar()
            or 0
        )


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
