"""The Postgres and Redis a bench runs against, prepared once, and each run's environment."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cached_property

import redis
from sqlalchemy import Engine, text

from callgate.core.settings import Settings
from callgate.ops.lab.bench import durable
from callgate.ops.lab.demo import downstream
from callgate.ops.lab.demo.tools import DEMO_TOOLS
from callgate.queue import transport
from callgate.store import db, migrate

# callgate's tables a bench run writes to (see Services.tidy).
TABLES = tuple(
    f"callgate.{t}" for t in ("calls", "operations", "outbox", "trace_events", "turns", "approvals")
)


@dataclass(frozen=True)
class Services:
    database_url: str
    redis_url: str

    @classmethod
    def prepare(cls, settings: Settings) -> Services:
        """Migrate callgate's schema, install the demo downstream and the minimum durable
        work's tables (all idempotent)."""
        services = cls(settings.require_database(), settings.require_redis())
        migrate.upgrade(services.engine)
        downstream.install(services.engine)
        durable.install(services.engine)
        with transport.translate_errors("bench"):
            services.redis.ping()
        return services

    @cached_property
    def engine(self) -> Engine:
        return db.create(self.database_url, application_name="callgate-bench")

    @cached_property
    def redis(self) -> redis.Redis:
        return transport.connect(self.redis_url)

    def tidy(self) -> None:
        """VACUUM (ANALYZE) callgate's tables before a measured run.

        Every call leaves dead row versions behind (reserved, completed, published), and a
        bench leaves tens of thousands. Without a vacuum they stay in the partial index of
        open calls, and without statistics the planner scans that index on every
        completion: measured on a server with autovacuum off, Postgres spent 4.7-5.7 ms of
        CPU per no-op call before a VACUUM ANALYZE and 1.4-1.7 ms after, so each run was
        slower than the one before. A production server's autovacuum does this work; here
        the bench does it, outside the measured window."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM (ANALYZE) {', '.join(TABLES)}"))

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        """The environment of one run's processes: its own queue, the demo tools."""
        return {
            "CALLGATE_DATABASE_URL": self.database_url,
            "CALLGATE_REDIS_URL": self.redis_url,
            "CALLGATE_QUEUE": queue,
            "CALLGATE_TOOLS": DEMO_TOOLS,
            "CALLGATE_LOG_LEVEL": "WARNING",
            **extra,
        }

    def settings(self, env: dict[str, str]) -> Settings:
        return Settings.from_env(env)


def queue_name(prefix: str) -> str:
    """A queue of one run: its keys never meet another run's or another user's."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def delete_keys(connection: redis.Redis, pattern: str) -> None:
    """Delete the keys matching ``pattern`` (SCAN, never KEYS or FLUSHDB: Redis is shared)."""
    batch: list[bytes] = []
    for key in connection.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            connection.delete(*batch)
            batch.clear()
    if batch:
        connection.delete(*batch)
