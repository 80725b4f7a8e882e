"""Fixtures for fault tests; import them explicitly into a test module:

from tests.faults.fixtures import pg_proxy, redis_proxy  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.conftest import ADMIN_URL, REDIS_URL
from tests.faults.pgproxy import PgProxy
from tests.faults.redisproxy import RedisProxy


def _upstream(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


@pytest.fixture
def pg_proxy() -> Iterator[PgProxy]:
    """A Postgres proxy in front of the test server; ``pg_proxy.url(database_url)``."""
    proxy = PgProxy(*_upstream(ADMIN_URL, 5432))
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def redis_proxy() -> Iterator[RedisProxy]:
    """A Redis proxy in front of the test server; ``redis_proxy.url(redis_url)``."""
    proxy = RedisProxy(*_upstream(REDIS_URL, 6379))
    proxy.start()
    yield proxy
    proxy.stop()
