"""A real PgBouncer (Debian's ``pgbouncer``) in transaction mode in front of the test
PostgreSQL, for tests that run callgate the way a deployment past a few hosts does.

Transaction mode is the strict one: each transaction of a client connection may run on
another server connection, so a prepared statement, a ``LISTEN`` or a session setting made
in one transaction is gone (or on somebody else's connection) in the next.
``PgBouncer.url_for`` rewrites a test database URL to go through it, with ``?pgbouncer=true``
(callgate then prepares nothing and does not rely on ``LISTEN``); ``raw=True`` leaves the
flag out, to show what callgate would hit without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.acceptance.prometheus_server import free_port_block

# PgBouncer refuses to run as root; Debian's postgresql package makes this user.
RUN_AS = "postgres"


class PgBouncer:
    def __init__(self, folder: Path, port: int, upstream_host: str, upstream_port: int) -> None:
        self.folder = folder
        self.port = port
        users = folder / "users.txt"
        # auth_type trust: PgBouncer checks only that the user is listed; the test
        # PostgreSQL trusts local connections anyway.
        users.write_text('"postgres" ""\n"root" ""\n')
        config = folder / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={upstream_host} port={upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            "max_client_conn = 500\n"
            "default_pool_size = 10\n"
            # Sent by psycopg/SQLAlchemy at connect; harmless here, refused by default.
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {folder / 'pgbouncer.log'}\n"
            f"pidfile = {folder / 'pgbouncer.pid'}\n"
        )
        for path in (folder, users, config):
            path.chmod(0o777 if path.is_dir() else 0o644)
        self.process = subprocess.Popen(
            ["pgbouncer", "-u", RUN_AS, str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(
                    f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=1
                ) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"pgbouncer did not start: {self.log()}") from None
                time.sleep(0.1)

    def url_for(self, database_url: str, *, raw: bool = False) -> str:
        """``database_url`` through this PgBouncer (with ``?pgbouncer=true`` unless ``raw``)."""
        url = make_url(database_url).set(host="127.0.0.1", port=self.port)
        if not raw:
            url = url.update_query_dict({"pgbouncer": "true"})
        return url.render_as_string(hide_password=False)

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text()[-2000:] if path.exists() else "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[PgBouncer]:
    if shutil.which("pgbouncer") is None:
        pytest.fail("Debian's pgbouncer is required for this test (apt-get install pgbouncer)")
    upstream = make_url(
        os.environ.get("CALLGATE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/test")
    )
    folder = Path(tempfile.mkdtemp(prefix="callgate-pgbouncer-"))
    bouncer = PgBouncer(
        folder, free_port_block(1), upstream.host or "127.0.0.1", upstream.port or 5432
    )
    yield bouncer
    bouncer.stop()
    shutil.rmtree(folder, ignore_errors=True)
