"""The relayer: publishes committed outbox rows to Redis for fan-in.

Claim a batch with ``FOR UPDATE SKIP LOCKED`` (several relayers never publish the same rows
at once), publish, mark, commit. A relayer killed between publish and mark leaves its rows
unmarked and unlocked: they are published again, so fan-in drops duplicates by call id.
It sleeps on ``LISTEN callgate_outbox`` and polls on timeout (a notification sent while it
was disconnected is lost, so it always drains once after (re)connecting). Behind a pooler in
transaction mode a LISTEN does not last: it listens on ``CALLGATE_DIRECT_DATABASE_URL`` when
set, or polls the outbox every ``POLL_WITHOUT_LISTEN_SECONDS``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from callgate.core import logs
from callgate.observe import metrics, tracing
from callgate.queue import results
from callgate.store import db, outbox
from callgate.store.db import Engine

log = logging.getLogger("callgate.relayer")


def drain_once(
    engine: Engine,
    connection: redis.Redis,
    *,
    queue: str,
    batch: int,
    mark_delay: float = 0.0,
) -> int:
    """Publish one batch. Returns how many rows it published (0: nothing was waiting)."""
    with outbox.claimed(engine, batch) as claim:
        rows = claim.rows
        if not rows:
            return 0
        claimed = time.time_ns()
        # One script: fenced by the rows' history, each row's entry then its published mark
        # (0 when an earlier publish of this row got this far).
        first = results.publish(
            connection,
            queue,
            rows[0].epoch,
            [results.Row(row.id, row.turn_id, row.payload) for row in rows],
        )
        metrics.outbox_published(len(rows))
        metrics.outbox_republished(first.count(False))
        metrics.relayed(row.age_seconds for row in rows)
        _published(rows, first)
        if tracing.active():
            _traced(claim, first, claimed)
        if mark_delay:
            # Chaos knob (CALLGATE_RELAYER_MARK_DELAY_MS): widens the publish-to-mark window
            # so a test can kill the relayer inside it.
            time.sleep(mark_delay)
        claim.mark()
    return len(rows)


def _published(rows: Sequence[Any], first: Sequence[bool]) -> None:
    """One log record per published row (at INFO: off at the default level)."""
    if log.isEnabledFor(logging.INFO):
        for row, new in zip(rows, first, strict=True):
            event = "published" if new else "republished"
            logs.event(log, event, turn_id=row.turn_id, call_ref=row.call_ref)


def _traced(claim: outbox.Claim, first: Sequence[bool], claimed: int) -> None:
    """A ``callgate.relay`` span per published row of a traced turn: from the row's commit
    (its age when claimed, on Postgres' clock) to now."""
    contexts = claim.trace_contexts()
    published = time.time_ns()
    for row, new in zip(claim.rows, first, strict=True):
        context = contexts.get(row.turn_id)
        if context is not None:
            tracing.relayed(
                turn_id=row.turn_id,
                call_ref=row.call_ref,
                trace_context=context,
                created=claimed - int(row.age_seconds * 1e9),
                published=published,
                republished=not new,
            )


def drain(
    engine: Engine, connection: redis.Redis, *, queue: str, batch: int, mark_delay: float = 0.0
) -> int:
    """Publish batches until one comes back short: then nothing else was waiting when it was
    claimed (a row committed since wakes the relayer through its own notification)."""
    total = 0
    while True:
        n = drain_once(engine, connection, queue=queue, batch=batch, mark_delay=mark_delay)
        total += n
        if n < batch:
            return total


# Behind a transaction pooler with no direct URL to LISTEN on, the relayer looks at the
# outbox this often instead: one indexed query returning no row, 20 times a second.
POLL_WITHOUT_LISTEN_SECONDS = 0.05


def listen_url(database_url: str, direct_url: str | None) -> str | None:
    """Where the relayer LISTENs: the direct URL when given, else the database URL unless a
    transaction pooler is in front of it (a LISTEN there is lost when its transaction ends,
    so the relayer polls instead)."""
    if direct_url:
        return direct_url
    return None if db.behind_transaction_pooler(database_url) else database_url


def run(
    engine: Engine,
    connection: redis.Redis,
    database_url: str | None,
    *,
    queue: str,
    batch: int,
    poll_seconds: float = 1.0,
    mark_delay: float = 0.0,
    debounce: float = 0.0,
    stop: threading.Event | None = None,
) -> None:
    """Relay until ``stop`` is set, woken by ``LISTEN`` on ``database_url`` (by polling every
    ``POLL_WITHOUT_LISTEN_SECONDS`` when it is None), ``debounce`` seconds after each wake-up.
    Reconnects on its own after Postgres or Redis hiccups."""
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            if database_url is None:
                while not stop.is_set():
                    drain(engine, connection, queue=queue, batch=batch, mark_delay=mark_delay)
                    stop.wait(POLL_WITHOUT_LISTEN_SECONDS)
                return
            with outbox.listening(database_url) as listener:
                drain(engine, connection, queue=queue, batch=batch, mark_delay=mark_delay)
                while not stop.is_set():
                    # Wake on the first notification or after poll_seconds; woken, wait
                    # ``debounce`` for the completions committing beside it (one batch
                    # instead of many small ones), take every notification queued by then
                    # (one drain publishes all their rows), then drain.
                    if listener.wait(poll_seconds) and debounce > 0:
                        stop.wait(debounce)
                    listener.take_queued()
                    drain(engine, connection, queue=queue, batch=batch, mark_delay=mark_delay)
        except Exception as exc:  # keep relaying: a restart would lose nothing, but costs time
            log.warning("relayer: %s; retrying in 1s", exc)
            stop.wait(1.0)
