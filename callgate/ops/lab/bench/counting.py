"""Counts Postgres statements, commits and round trips, and Redis commands and round trips,
by phase, inside this process.

Postgres, through SQLAlchemy's engine events: every statement; ``BEGIN``/``COMMIT`` only on
connections that send them (autocommit connections do not, although SQLAlchemy fires the
events), where each statement is its own commit; and the statements a worker sends on the
pooled driver connection (``store.db.raw_autocommit``), each its own commit. Redis, by
wrapping redis-py's connection: a round trip is one packed send (a pipeline is one), a
command is one command inside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from redis.connection import Connection as RedisConnection
from sqlalchemy import Engine, event

from callgate.store import db

COUNTS: Counter[str] = Counter()
_phase = ["idle"]


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Count everything sent until the block ends under ``name``."""
    _phase[0] = name
    try:
        yield
    finally:
        _phase[0] = "idle"


def _add(what: str, n: int = 1) -> None:
    COUNTS[f"{_phase[0]}:{what}"] += n


def count_postgres(engine: Engine, label: str = "pg") -> None:
    def statement(conn: Any, *_: Any) -> None:
        _add(f"{label}_statements")
        _add(f"{label}_round_trips")
        if _autocommit(conn):
            _add(f"{label}_commits")

    def begin(conn: Any) -> None:
        if not _autocommit(conn):
            _add(f"{label}_round_trips")

    def commit(conn: Any) -> None:
        if not _autocommit(conn):
            _add(f"{label}_round_trips")
            _add(f"{label}_commits")

    def raw_statement() -> None:  # db.raw_autocommit: each statement is its own commit
        _add(f"{label}_statements")
        _add(f"{label}_round_trips")
        _add(f"{label}_commits")

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begin)
    event.listen(engine, "commit", commit)
    db.on_raw_statement(engine, raw_statement)


def _autocommit(conn: Any) -> bool:
    return bool(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")


_installed = [False]


def count_redis() -> None:
    """Wrap redis-py's connection class (every client of this process) once."""
    if _installed[0]:
        return
    _installed[0] = True
    send_packed: Any = RedisConnection.send_packed_command
    send_command: Any = RedisConnection.send_command
    pack_commands: Any = RedisConnection.pack_commands

    def counted_send_packed(self: Any, command: Any, check_health: bool = True) -> None:
        _add("redis_round_trips")
        send_packed(self, command, check_health)

    def counted_send_command(self: Any, *args: Any, **kwargs: Any) -> None:
        _add("redis_commands")
        send_command(self, *args, **kwargs)

    def counted_pack_commands(self: Any, commands: Any) -> Any:
        commands = list(commands)
        _add("redis_commands", len(commands))
        return pack_commands(self, commands)

    RedisConnection.send_packed_command = counted_send_packed  # type: ignore[method-assign]
    RedisConnection.send_command = counted_send_command  # type: ignore[method-assign]
    RedisConnection.pack_commands = counted_pack_commands  # type: ignore[method-assign]


def per_call(phase_name: str, calls: int, labels: tuple[str, ...] = ("pg",)) -> dict[str, float]:
    """The counts of one phase divided by ``calls``."""
    keys = [f"{label}_{what}" for label in labels for what in ("statements", "commits")]
    keys += [f"{label}_round_trips" for label in labels]
    keys += ["redis_commands", "redis_round_trips"]
    return {key: round(COUNTS[f"{phase_name}:{key}"] / calls, 2) for key in keys}
