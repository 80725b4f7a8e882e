"""Shared fixtures. Service fixtures fail loudly: a test that needs Postgres or Redis never
silently skips.

- ``CALLGATE_TEST_ADMIN_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``): a
  database from which each test session creates (and drops) its own fresh databases.
- ``CALLGATE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); every test gets its
  own queue name, so its keys never meet another test's.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine

from callgate.ops.lab.demo import downstream
from callgate.store import db, migrate

# The fault proxies' fixtures (pg_proxy, redis_proxy) and the fault matrix's summary, for
# every test module: registered once here, so no module imports them before pytest can
# rewrite their asserts.
pytest_plugins = ["tests.faults.fixtures", "tests.pgbouncer", "tests.sentinel"]

ADMIN_URL = os.environ.get("CALLGATE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("CALLGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _database_url(name: str) -> str:
    base = ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def make_database() -> Iterator[Callable[..., str]]:
    """Create empty databases on demand; all are dropped at the end of the session."""
    created: list[str] = []

    def make(template: str | None = None) -> str:
        name = f"callgate_test_{uuid.uuid4().hex[:12]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        try:
            with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'CREATE DATABASE "{name}"{copy}')
        except psycopg.OperationalError as exc:
            pytest.fail(f"PostgreSQL at {ADMIN_URL} is required for this test: {exc}")
        created.append(name)
        return _database_url(name)

    yield make
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _migrated(url: str) -> str:
    engine = db.create(url)
    migrate.upgrade(engine)
    downstream.install(engine)
    engine.dispose()
    return url


@pytest.fixture(scope="session")
def database_url(make_database: Callable[..., str]) -> str:
    """One migrated database with the demo downstream, shared by a test session."""
    return _migrated(make_database())


@pytest.fixture(scope="session")
def make_own_database(make_database: Callable[..., str]) -> Callable[[], str]:
    """Migrated databases of one's own, copied from a template nobody connects to.

    For tests whose sweeper would otherwise re-dispatch other tests' open calls from the
    shared database, and for tests that count rows across the whole database."""
    template = _migrated(make_database()).rsplit("/", 1)[1]
    return lambda: make_database(template)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = db.create(database_url, pool_size=4)
    yield eng
    eng.dispose()


@pytest.fixture
def fresh_payments(engine: Engine) -> None:
    """Reset the demo downstream to its seed (for tests that count its rows)."""
    downstream.install(engine, reset=True)


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(f"Redis at {REDIS_URL} is required for this test: {exc}")
    return REDIS_URL


@pytest.fixture
def queue_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def service_env(database_url: str, redis_url: str, queue_name: str) -> dict[str, str]:
    """Environment for callgate processes of one test."""
    return {
        "CALLGATE_DATABASE_URL": database_url,
        "CALLGATE_REDIS_URL": redis_url,
        "CALLGATE_QUEUE": queue_name,
        # Named explicitly: no process falls back to the demo tools on its own.
        "CALLGATE_TOOLS": "callgate.ops.lab.demo.tools:demo_registry",
    }


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A tracer provider for this test only, exporting into memory (the global one is put
    back after)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()
