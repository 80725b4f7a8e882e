"""A real PostgreSQL primary and an asynchronous streaming replica, private to one test or
one chaos scenario, to see what a failover does to callgate.

The servers are PostgreSQL's own programs (``initdb``, ``pg_ctl``, ``pg_basebackup``): a
Debian/Ubuntu ``postgresql`` package's, any on ``PATH``, or the ones the demo extra's pgserver
ships. Both clusters live in a temporary folder, listen on 127.0.0.1 only, trust every local
connection and are killed, with the folder, by ``close()``. The servers refuse to run as root:
under root they run as the ``postgres`` user, which must exist.

The moment a test chooses is modelled by ``freeze()``: the replica stops and keeps exactly
the WAL it received so far; whatever the primary commits after is lost by ``fail_over()``,
which kills the primary and promotes the replica on the primary's port, so ``url`` stays the
one a client was given::

    with Replicated() as pg:
        pg.replicate()
        ...            # write on pg.url
        pg.caught_up()
        pg.freeze()
        ...            # write on pg.url: lost
        pg.fail_over()
        ...            # pg.url is the promoted replica, on a new timeline
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, LiteralString

import psycopg

from callgate.core.errors import CallgateError, ErrorCode
from callgate.ops.lab.ports import free_port_block

# The database superuser initdb creates, and the system user the servers run as under root
# (Debian's postgresql package makes it).
RUN_AS = "postgres"
DATABASE = "test"
# Every program this harness runs; a folder that lacks one is not a server install.
PROGRAMS = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
# What the replica calls itself to the primary: synchronous_standby_names may name it.
REPLICA_NAME = "replica"
TIMEOUT = 30.0

PRIMARY_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "hot_standby": "on",
    # A test's cluster never survives a crash it cares about: the failover promotes the
    # replica, and the primary's data folder is never started again.
    "fsync": "off",
    "shared_buffers": "'16MB'",
    "max_connections": "100",
    # Enough that the replica never falls off the primary's WAL between the base backup
    # and its start, without a slot that would keep WAL forever once it is frozen.
    "wal_keep_size": "'64MB'",
}

HBA = (
    "local all all trust\n"
    "local replication all trust\n"
    "host all all 127.0.0.1/32 trust\n"
    "host replication all 127.0.0.1/32 trust\n"
)


class Replicated:
    """A primary on ``port``, and after ``replicate()`` a streaming replica on
    ``replica_port``; after ``fail_over()``, ``port`` serves the promoted replica."""

    def __init__(self, database: str = DATABASE, settings: dict[str, str] | None = None) -> None:
        """``settings``: postgresql.conf lines the primary gets after ``PRIMARY_SETTINGS``
        (a later line wins), for a caller that needs a server configured otherwise."""
        self.bin = server_programs()
        if self.bin is None:
            raise unavailable()
        self.as_user = _service_user()
        self.database = database
        self.settings = settings or {}
        self.root = Path(tempfile.mkdtemp(prefix="callgate-pgrepl-"))
        # The servers write into it; the sockets go here too, so nothing of the machine's
        # own cluster (/var/run/postgresql) is touched.
        if self.as_user is not None:
            shutil.chown(self.root, self.as_user, self.as_user)
        self.port, self.replica_port = _two_ports()
        self.primary_dir = self.root / "primary"
        self.replica_dir = self.root / "replica"
        self.running: set[Path] = set()

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> Replicated:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """initdb the primary, start it, and create the database (``test`` by default)."""
        self._run(
            "initdb",
            "-D",
            str(self.primary_dir),
            "-U",
            RUN_AS,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            "--no-instructions",
        )
        (self.primary_dir / "pg_hba.conf").write_text(HBA)
        _configure(
            self.primary_dir,
            {
                **PRIMARY_SETTINGS,
                **self.settings,
                "unix_socket_directories": f"'{self.root}'",
            },
        )
        self._start(self.primary_dir, self.port)
        with self._connect(self.port, "postgres") as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def close(self) -> None:
        """Kill both servers (whatever state a failed test left them in) and remove it all."""
        for data in list(self.running):
            # A server that never came up, or is already gone: pg_ctl fails, and that is fine.
            with contextlib.suppress(CallgateError, OSError):
                self._stop(data, "immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- replication ------------------------------------------------------------------------

    def replicate(self) -> None:
        """A replica from a base backup of the primary, streaming and caught up."""
        source = f"host=127.0.0.1 port={self.port} user={RUN_AS} application_name={REPLICA_NAME}"
        # -R writes standby.signal and primary_conninfo (with application_name) for us.
        self._run(
            "pg_basebackup",
            "-d",
            source,
            "-D",
            str(self.replica_dir),
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",  # a spread checkpoint would make this wait minutes
            "--no-sync",
        )
        self._start(self.replica_dir, self.replica_port)
        self._wait("the replica to stream from the primary", self._streaming)
        self.caught_up()

    def caught_up(self) -> None:
        """Wait until the replica has replayed everything the primary has written so far."""
        target = self._scalar(self.port, "SELECT pg_current_wal_lsn()::text")
        self._wait(
            f"the replica to replay up to {target}",
            lambda: bool(
                self._scalar(
                    self.replica_port,
                    "SELECT coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, false)",
                    (target,),
                )
            ),
        )

    def freeze(self) -> None:
        """Stop the replica: it keeps what it has received so far, and nothing after.

        With ``synchronous(True)`` a commit on the primary then waits for good: as it would
        with its only synchronous standby gone."""
        self._stop(self.replica_dir, "fast")

    def fail_over(self) -> None:
        """Kill the primary and promote the replica on the primary's port.

        The replica must be frozen first (or is frozen here): the primary's port is
        the replica's upstream, and it must not stream from itself once it has that port."""
        self._stop(self.primary_dir, "immediate")
        if self.replica_dir in self.running:
            self._stop(self.replica_dir, "fast")
        # Without its upstream, recovery replays what is in pg_wal and then waits for the
        # promotion; this also keeps the port for the next start, as a real rename would.
        _configure(self.replica_dir, {"primary_conninfo": "''", "port": str(self.port)})
        self._start(self.replica_dir, self.port)
        self._run("pg_ctl", "promote", "-w", "-t", str(int(TIMEOUT)), "-D", str(self.replica_dir))
        self._wait(
            "the promoted replica to accept writes",
            lambda: self._scalar(self.port, "SELECT NOT pg_is_in_recovery()") is True,
        )
        self.replica_port = self.port

    def synchronous(self, on: bool) -> None:
        """Make the primary's commits wait for the replica to flush them (or stop waiting).

        ``'*'`` makes any standby eligible, the replica (``application_name=replica``)
        included."""
        names = "*" if on else ""
        with self._connect(self.port) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            conn.execute("SELECT pg_reload_conf()")
        # pg_reload_conf() only signals the postmaster. A fresh session seeing the value
        # means the postmaster has reloaded and signalled its children...
        self._wait(
            f"synchronous_standby_names to be {names!r}",
            lambda: self._scalar(self.port, "SHOW synchronous_standby_names") == names,
        )
        if on:
            self._wait(
                "the replica to be the synchronous standby",
                lambda: (
                    self._scalar(
                        self.port,
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                        (REPLICA_NAME,),
                    )
                    == "sync"
                ),
            )
        # ...but commits wait only once the checkpointer has reloaded too (it publishes
        # whether synchronous standbys are defined), and it reloads before serving a
        # CHECKPOINT.
        with self._connect(self.port) as conn:
            conn.execute("CHECKPOINT")

    @property
    def url(self) -> str:
        return f"postgresql://{RUN_AS}@127.0.0.1:{self.port}/{self.database}"

    @property
    def replica_url(self) -> str:
        return f"postgresql://{RUN_AS}@127.0.0.1:{self.replica_port}/{self.database}"

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.root.glob("*.log"))
        )

    # -- helpers ----------------------------------------------------------------------------

    def _streaming(self) -> bool:
        state = self._scalar(
            self.port,
            "SELECT state FROM pg_stat_replication WHERE application_name = %s",
            (REPLICA_NAME,),
        )
        return bool(state == "streaming")

    def _start(self, data: Path, port: int) -> None:
        log = self.root / f"{data.name}.log"
        # Before the start: a start that times out may leave a server running all the same.
        self.running.add(data)
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(int(TIMEOUT)),
            "-D",
            str(data),
            "-l",
            str(log),
            "-o",
            f"-p {port}",
        )

    def _stop(self, data: Path, mode: Literal["fast", "immediate"]) -> None:
        self._run("pg_ctl", "stop", "-w", "-t", str(int(TIMEOUT)), "-m", mode, "-D", str(data))
        self.running.discard(data)

    def _run(self, program: str, *args: str) -> None:
        """``program`` (as postgres under root), from the folder it owns (initdb complains
        about a cwd it cannot read)."""
        assert self.bin is not None
        command = [str(self.bin / program), *args]
        if self.as_user is not None:
            command = ["runuser", "-u", self.as_user, "--", *command]
        try:
            subprocess.run(
                command,
                cwd=self.root,
                env={**os.environ, "LC_ALL": "C.UTF-8"},
                capture_output=True,
                text=True,
                timeout=TIMEOUT + 10,
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            raise _failed(
                f"{program} failed ({exc.returncode}): {exc.stderr or exc.stdout}\n{self.logs()}"
            ) from None
        except subprocess.TimeoutExpired:
            raise _failed(f"{program} did not finish\n{self.logs()}") from None

    def _connect(self, port: int, database: str | None = None) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1",
            port=port,
            user=RUN_AS,
            dbname=database or self.database,
            autocommit=True,
            connect_timeout=2,
        )

    def _scalar(self, port: int, sql: LiteralString, params: tuple[Any, ...] = ()) -> Any:
        with self._connect(port) as conn:
            row = conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except psycopg.Error as exc:  # a server still starting, or restarting
                last = exc
            time.sleep(0.05)
        raise _failed(f"timed out waiting for {what} (last error: {last})\n{self.logs()}")


def _configure(data: Path, settings: dict[str, str]) -> None:
    """Append to postgresql.auto.conf: read after postgresql.conf, and a later line wins,
    so this overrides what a base backup copied from the primary."""
    with (data / "postgresql.auto.conf").open("a") as f:
        f.writelines(f"{name} = {value}\n" for name, value in settings.items())


def server_programs() -> Path | None:
    """The newest folder holding PostgreSQL's server programs: a Debian/Ubuntu package's,
    the one on PATH, or pgserver's (the demo extra); None when there is none."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)],
        reverse=True,
    )
    on_path = shutil.which("pg_basebackup")
    candidates = [*debian, *([Path(on_path).parent] if on_path else []), *_pgserver_bin()]
    for folder in candidates:
        if all((folder / program).is_file() for program in PROGRAMS):
            return folder
    return None


def unavailable() -> CallgateError:
    return _failed(
        "a replicated PostgreSQL needs PostgreSQL's server programs (initdb, pg_ctl, "
        "pg_basebackup): install the postgresql package, or pip install 'callgate[demo]'"
    )


def _pgserver_bin() -> list[Path]:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return []
    return [Path(spec.origin).parent / "pginstall" / "bin"]


def _service_user() -> str | None:
    """Who the servers run as: ``postgres`` under root (they refuse root), else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        raise _failed(
            f"PostgreSQL refuses to run as root and there is no {RUN_AS!r} user to run it as: "
            f"create one, or run as another user"
        ) from None
    return RUN_AS


def _failed(message: str) -> CallgateError:
    return CallgateError(message, code=ErrorCode.EMBEDDED_SERVICE_FAILED)


def _two_ports() -> tuple[int, int]:
    base = free_port_block(2)
    return base, base + 1
