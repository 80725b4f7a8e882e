"""Is the database's callgate schema the one this code ships? One query, at process start.

A process that meets a database ``callgate migrate`` never ran on (or ran with an older or a
newer callgate) stops with ``not_migrated`` and one line saying what to run, instead of
failing every statement with ``relation "callgate.calls" does not exist``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from pathlib import Path

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError

from callgate.core.errors import CallgateError, ErrorCode
from callgate.store import db
from callgate.store.schema import SCHEMA

_VERSIONS = Path(__file__).with_name("migrations") / "versions"

# Engines already found current: a producer built from ``from_env`` and then constructed
# checks once, not twice.
_current: weakref.WeakSet[Engine] = weakref.WeakSet()


def shipped() -> tuple[str, ...]:
    """The revisions this code ships, oldest first. Each migration's file name starts with
    its revision id and the history is linear (checked against Alembic by a test), so the
    head is found without importing Alembic or the migrations."""
    return tuple(sorted(p.name.split("_", 1)[0] for p in _VERSIONS.glob("[0-9]*_*.py")))


def problem(current: str | None, known: Sequence[str]) -> str | None:
    """What is wrong with a database at revision ``current`` (None: no callgate schema) for
    code that ships ``known`` (oldest first); None when it is at the head."""
    head = known[-1]
    if current == head:
        return None
    if current is None:
        return (
            f"the database has no callgate schema (revision none, this callgate needs {head}): "
            "run callgate migrate"
        )
    if current in known:
        return (
            f"the database is at revision {current}, this callgate needs {head}: "
            "run callgate migrate"
        )
    return (
        f"the database is at revision {current}, this callgate knows up to {head}: upgrade callgate"
    )


def current_revision(engine: Engine, *, pooled: bool = True) -> str | None:
    """The revision Alembic recorded in the callgate schema; None when there is none. With
    ``pooled=False`` the connection is closed after, not kept in the engine's pool."""
    try:
        with db.autocommit(engine) as conn:
            rows = conn.execute(text(f"SELECT version_num FROM {SCHEMA}.alembic_version")).all()
            if not pooled:
                conn.invalidate()
    except ProgrammingError as exc:
        if isinstance(exc.orig, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
            return None
        raise
    return max((str(r[0]) for r in rows), default=None)


def require_current(engine: Engine, what: str, *, pooled: bool = True) -> None:
    """Raise ``not_migrated`` unless the database is at this code's head revision; a
    database that cannot be reached raises ``database_unavailable`` as any statement would.
    Once per engine."""
    if engine in _current:
        return
    with db.translate_errors(what):
        current = current_revision(engine, pooled=pooled)
    known = shipped()
    message = problem(current, known)
    if message is not None:
        raise CallgateError(
            message,
            code=ErrorCode.NOT_MIGRATED,
            details=[
                {"code": ErrorCode.NOT_MIGRATED, "revision": current, "head": known[-1]},
            ],
        )
    _current.add(engine)


def require_current_at(url: str, what: str) -> None:
    """``require_current`` on a short-lived connection of its own, for a process that does
    not keep an engine of its own from the start (the HTTP API)."""
    engine = db.create(url, pool_size=1, max_overflow=0, application_name="callgate-check")
    try:
        require_current(engine, what)
    finally:
        engine.dispose()
