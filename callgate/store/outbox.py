"""The relayer's statements: claim a batch of unpublished outbox rows, mark them published.

A claim is ``FOR UPDATE SKIP LOCKED`` inside the transaction that publishes and marks the
rows (``claimed``): several relayers never publish the same rows at once, and a relayer
killed between its publish and its mark leaves its rows unmarked and unlocked, to be
published again (fan-in drops the duplicate by call id).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Engine

from callgate.store import db

# The call's result as Postgres' own JSON text: published as it is, never parsed and dumped
# again (the same JSON value; fan-in parses it). An outbox row holds no copy of the result
# (a row written before migration 0015 may). The row's age, on Postgres' clock, feeds the
# relay-latency histogram.
#
# ``epoch``: the PostgreSQL history the rows are read from, which the publish is fenced by
# (``queue.results``). ``history_epoch()`` raises on a history not reconciled yet: nothing is
# published from it until a sweeper has reconciled it.
CLAIM_SQL = """
SELECT o.id, o.turn_id, o.call_ref, CAST(coalesce(o.payload, c.result) AS text) AS payload,
       CAST(EXTRACT(EPOCH FROM clock_timestamp() - o.created_at) AS float8) AS age_seconds,
       h.epoch
  FROM callgate.outbox AS o
  JOIN callgate.calls AS c ON c.id = o.call_ref
 CROSS JOIN (SELECT callgate.history_epoch() AS epoch) AS h
 WHERE o.published_at IS NULL
 ORDER BY o.id
 LIMIT :batch
   FOR UPDATE OF o SKIP LOCKED
"""

MARK_SQL = "UPDATE callgate.outbox SET published_at = now() WHERE id = ANY(:ids)"

# Only when a tracer provider is set: the submit contexts of a batch's turns, the parents of
# their ``callgate.relay`` spans.
TRACE_CONTEXTS_SQL = """
SELECT turn_id, trace_context FROM callgate.turns
 WHERE turn_id = ANY(:turns) AND trace_context IS NOT NULL
"""

# What every statement that writes outbox rows notifies (``pg_notify``) in its commit.
CHANNEL = "callgate_outbox"

_CLAIM = db.Statement(CLAIM_SQL)
_MARK = db.Statement(MARK_SQL)
_TRACE_CONTEXTS = db.Statement(TRACE_CONTEXTS_SQL)


class Claim:
    """An open transaction holding a batch of claimed rows (``rows``) until ``mark``."""

    def __init__(self, conn: db.RawConnection, rows: list[Any]) -> None:
        self._conn = conn
        self.rows = rows

    def mark(self) -> None:
        self._conn.execute(_MARK, {"ids": [row.id for row in self.rows]})

    def trace_contexts(self) -> dict[uuid.UUID, dict[str, str]]:
        turns = list({row.turn_id for row in self.rows})
        found = self._conn.execute(_TRACE_CONTEXTS, {"turns": turns})
        return {r.turn_id: r.trace_context for r in found}


@contextmanager
def claimed(engine: Engine, batch: int) -> Iterator[Claim]:
    """Claim up to ``batch`` rows in a transaction that commits when the block ends (and
    rolls back, leaving them to be published again, if it raises)."""
    with db.raw_autocommit(engine) as conn, conn.driver.transaction():
        yield Claim(conn, conn.execute(_CLAIM, {"batch": batch}))


class Listener:
    """A connection LISTENing on ``CHANNEL``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification; whether one came."""
        return any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))

    def take_queued(self) -> None:
        """Consume the notifications already queued: one drain publishes all their rows."""
        for _ in self._conn.notifies(timeout=0):
            pass


@contextmanager
def listening(database_url: str) -> Iterator[Listener]:
    """A direct connection (not through a transaction pooler) LISTENing on ``CHANNEL``."""
    with psycopg.connect(db.libpq_url(database_url), autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")
        yield Listener(conn)
