"""The minimum durable work per call: the floor any executor with callgate's promises pays.

callgate promises one winner per call (two deliveries of one job never both run it), a fenced
completion (a worker that lost its reservation cannot overwrite the winner's result) and a
result that reaches the producer (an outbox row committed with the result, published after).
Whatever the executor, that takes at least:

1. a guarded reservation, committed before the tool runs (``RESERVE_SQL``): one UPDATE that
   only a queued call matches, so exactly one delivery gets a row back, and a generation that
   fences every later write of that reservation;
2. after the tool, ONE transaction (``COMPLETE_SQL``, ``RESULT_SQL``, ``OUTBOX_SQL``): the
   fenced state flip, the result row and the outbox row, so the result and its publication
   are committed together or not at all.

Two commits per call, on tables with primary keys only (every further index is a choice an
executor makes, not part of the floor). No gate, no trace, no leases, no retries: the
baselines ``RQ + minimum durable work`` and ``dramatiq + minimum durable work`` run exactly
this, and the first reservation → last completion of their rows (Postgres'
``clock_timestamp()``) is their window, the same window callgate's throughput is read from.

The write ceiling (``refund``) is the same two commits with the write between them: after
the reservation, the demo payments provider's refund (``Payments.refund``, the one
callgate's ``refund_payment`` and bare RQ's refund job send), with the call's own idempotency
key (``refund_key``) and the reservation's generation as its fence; its response is the
result. Each call refunds the payment of the same orders as callgate's write scenario and
bare RQ's refunds: one new order per turn of 20, amounts 1, 2, 3, … (``seed_refunds``). The
baselines ``RQ + minimum durable work + the same refund`` and ``dramatiq + minimum durable
work + the same refund`` (the writes' threaded ceiling) run it, and each run is checked on
both sides: its own rows (``Run.check``) and the provider's (``Refunds.check``: one request,
one refund row and one side effect per call, fenced with its generation, no rejection).

The tables live in the bench's own schema ``bench_min`` on the bench's database, created by
the bench; each run's rows carry its run id, are inserted before the workers start and
deleted after the run (the provider's rows stay, as bare RQ's and callgate's refunds do).
The worker side (``work``, ``refund``) speaks psycopg directly, one connection per thread,
made when the thread starts (``warm``), so the window never holds a connect; the write
ceiling's threads also hold one connection each to the provider (``warm_downstream``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import psycopg
from sqlalchemy import Engine, text

from callgate.ops.lab.bench.procs import BenchError
from callgate.ops.lab.bench.workload import TURN, new_order
from callgate.ops.lab.demo.downstream import Payments
from callgate.store import db

SCHEMA = "bench_min"

INSTALL_SQL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.calls (
    id           uuid PRIMARY KEY,
    run          text NOT NULL,
    state        text NOT NULL DEFAULT 'queued',
    owner        text,
    generation   integer NOT NULL DEFAULT 0,
    reserved_at  timestamptz,
    completed_at timestamptz
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.results (
    call_id    uuid PRIMARY KEY,
    generation integer NOT NULL,
    body       jsonb NOT NULL
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.outbox (
    id           bigserial PRIMARY KEY,
    call_id      uuid NOT NULL,
    generation   integer NOT NULL,
    body         jsonb NOT NULL,
    published_at timestamptz
);
"""

# 1. The reservation: one winner (only a queued call matches), committed on its own.
RESERVE_SQL = f"""
UPDATE {SCHEMA}.calls
   SET state = 'running', owner = %(owner)s, generation = generation + 1,
       reserved_at = clock_timestamp()
 WHERE id = %(id)s AND state = 'queued'
RETURNING generation
"""

# 2. The completion, one transaction: the fenced flip (zero rows: the reservation was lost,
# roll back), the result and the outbox row.
COMPLETE_SQL = f"""
UPDATE {SCHEMA}.calls
   SET state = 'succeeded', completed_at = clock_timestamp()
 WHERE id = %(id)s AND generation = %(generation)s
"""
RESULT_SQL = f"""
INSERT INTO {SCHEMA}.results (call_id, generation, body)
VALUES (%(id)s, %(generation)s, CAST(%(body)s AS jsonb))
"""
OUTBOX_SQL = f"""
INSERT INTO {SCHEMA}.outbox (call_id, generation, body)
VALUES (%(id)s, %(generation)s, CAST(%(body)s AS jsonb))
"""

RESULT_BODY = '{"ok": true}'
KEY_PREFIX = "bench-min-"
# The write scenario's tenant and currency (workload.refunds, bare.refunds).
TENANT = "tenant-a"
CURRENCY = "KRW"

# --- the worker's side --------------------------------------------------------------------

_local = threading.local()


def warm() -> None:
    """Connect this thread before its first call (start-up stays outside the window)."""
    _connection()


def warm_downstream() -> None:
    """Connect this thread to the payments provider too (the write ceiling)."""
    _payments().engine.connect().close()


def close() -> None:
    """Close this thread's connections, if it made any."""
    conn: psycopg.Connection[tuple[object, ...]] | None = getattr(_local, "conn", None)
    if conn is not None:
        conn.close()
        _local.conn = None
    payments: Payments | None = getattr(_local, "payments", None)
    if payments is not None:
        payments.engine.dispose()
        _local.payments = None


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    conn: psycopg.Connection[tuple[object, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        url = db.libpq_url(os.environ["CALLGATE_DATABASE_URL"])
        conn = psycopg.connect(url, application_name="bench-min", connect_timeout=5)
        _local.conn = conn
        _local.owner = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    return conn


def _payments() -> Payments:
    payments: Payments | None = getattr(_local, "payments", None)
    if payments is None:
        # An engine of one connection per thread: no thread ever waits on another for the
        # provider, which a shared pool smaller than the threads would make it do.
        engine = db.create(
            os.environ["CALLGATE_DATABASE_URL"],
            pool_size=1,
            max_overflow=0,
            application_name="bench-min-downstream",
        )
        payments = Payments(engine)
        _local.payments = payments
    return payments


def work(call_id: str) -> bool:
    """Reserve, run nothing, complete. False when another delivery won or the fence held."""
    conn = _connection()
    generation = _reserve(conn, call_id)
    if generation is None:
        return False
    return _complete(conn, call_id, generation, RESULT_BODY)


def refund_key(call_id: str) -> str:
    """The refund's idempotency key: one per call, the same on every delivery of it."""
    return f"{KEY_PREFIX}{call_id}"


def refund(call_id: str, tenant_id: str, payment_id: str, amount: int) -> bool:
    """Reserve, refund ``amount`` of the payment at the provider (the call's key, the
    reservation's generation as the fence), complete with the provider's response. False
    when another delivery won or the fence held; the provider's refusal raises."""
    conn = _connection()
    generation = _reserve(conn, call_id)
    if generation is None:
        return False
    response = _payments().refund(
        key=refund_key(call_id),
        fence=generation,
        tenant_id=tenant_id,
        payment_id=payment_id,
        amount=amount,
        currency=CURRENCY,
    )
    return _complete(conn, call_id, generation, json.dumps(response))


def _reserve(conn: psycopg.Connection[tuple[object, ...]], call_id: str) -> int | None:
    """The reservation's generation, committed; None when another delivery won it."""
    found = conn.execute(RESERVE_SQL, {"id": call_id, "owner": _local.owner}).fetchone()
    conn.commit()
    return None if found is None else cast(int, found[0])


def _complete(
    conn: psycopg.Connection[tuple[object, ...]], call_id: str, generation: int, body: str
) -> bool:
    params = {"id": call_id, "generation": generation, "body": body}
    if conn.execute(COMPLETE_SQL, params).rowcount != 1:
        conn.rollback()  # fenced out: a newer reservation owns the call
        return False
    conn.execute(RESULT_SQL, params)
    conn.execute(OUTBOX_SQL, params)
    conn.commit()
    return True


# --- the bench's side ---------------------------------------------------------------------


def install(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(INSTALL_SQL)


def seed(engine: Engine, calls: int) -> tuple[str, list[str]]:
    """Insert ``calls`` queued calls of a new run; returns the run id and the call ids.
    Vacuums the schema's tables after (outside the window), as the bench does callgate's."""
    run = uuid.uuid4().hex[:12]
    with engine.begin() as conn:
        ids = conn.execute(
            text(
                f"INSERT INTO {SCHEMA}.calls (id, run)"
                " SELECT gen_random_uuid(), :run FROM generate_series(1, :n) RETURNING id"
            ),
            {"run": run, "n": calls},
        ).scalars()
        call_ids = [str(i) for i in ids]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f"VACUUM (ANALYZE) {SCHEMA}.calls, {SCHEMA}.results, {SCHEMA}.outbox"))
    return run, call_ids


def seed_refunds(engine: Engine, calls: int) -> tuple[str, list[tuple[str, str, str, int]]]:
    """``seed``, and each call's refund as ``refund``'s arguments: the same refunds as
    callgate's write scenario and bare RQ's, one new order per turn of ``TURN`` calls,
    amounts 1, 2, … Listed turn by turn in rotation (the first refund of every turn, then
    the second, …), as callgate runs them: a turn's writes one after another, the turns side
    by side. Listed turn after turn instead, K threads would take K refunds of one payment
    at once and wait on its row lock, a limit of the list's order, not of the work."""
    run, call_ids = seed(engine, calls)
    turns: list[list[tuple[str, str, str, int]]] = []
    for t, start in enumerate(range(0, calls, TURN)):
        payment = f"pay-{new_order(engine, f'min{t}')}"
        turns.append(
            [(call_ids[i], TENANT, payment, 1 + i) for i in range(start, min(calls, start + TURN))]
        )
    plan = [turn[n] for n in range(TURN) for turn in turns if n < len(turn)]
    return run, plan


# Over one run: its calls, the ones that ended, the ones reserved once, the result and outbox
# rows (and the calls they cover), the first reservation and the last completion.
RUN_SQL = f"""
SELECT count(*) AS calls,
       count(*) FILTER (WHERE c.state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE c.generation = 1) AS reserved_once,
       (SELECT count(*) FROM {SCHEMA}.results AS r
          JOIN {SCHEMA}.calls AS c2 ON c2.id = r.call_id WHERE c2.run = :run) AS results,
       (SELECT count(*) FROM {SCHEMA}.outbox AS o
          JOIN {SCHEMA}.calls AS c2 ON c2.id = o.call_id WHERE c2.run = :run) AS outbox,
       (SELECT count(DISTINCT o.call_id) FROM {SCHEMA}.outbox AS o
          JOIN {SCHEMA}.calls AS c2 ON c2.id = o.call_id WHERE c2.run = :run) AS outbox_calls,
       min(c.reserved_at) AS first_reserved,
       max(c.completed_at) AS last_completed
  FROM {SCHEMA}.calls AS c
 WHERE c.run = :run
"""


@dataclass(frozen=True)
class Run:
    calls: int
    succeeded: int
    reserved_once: int
    results: int
    outbox: int
    outbox_calls: int
    first_reserved: datetime | None
    last_completed: datetime | None

    def per_second(self) -> float:
        if self.first_reserved is None or self.last_completed is None:
            raise BenchError("minimum durable work: no call was reserved and completed")
        seconds = (self.last_completed - self.first_reserved).total_seconds()
        return self.calls / max(seconds, 1e-6)

    def check(self, what: str) -> None:
        """Every call ended once: one reservation, one result row, one outbox row each."""
        n = self.calls
        if not (
            n > 0
            and self.succeeded == self.reserved_once == self.results == n
            and self.outbox == self.outbox_calls == n
        ):
            raise BenchError(
                f"{what}: of {n} calls {self.succeeded} succeeded, {self.reserved_once} were "
                f"reserved once; {self.results} result rows, {self.outbox} outbox rows for "
                f"{self.outbox_calls} calls"
            )


def read(engine: Engine, run: str) -> Run:
    with engine.connect() as conn:
        row = conn.execute(text(RUN_SQL), {"run": run}).mappings().one()
    return Run(**dict(row))


# What the payments provider recorded for one run's calls (by their keys), counted in its own
# tables: requests received, refund rows (and the calls they cover), side effects (and those
# fenced with their call's generation), rejections.
REFUNDS_SQL = f"""
WITH keyed AS (
    SELECT :prefix || id::text AS idempotency_key, generation
      FROM {SCHEMA}.calls WHERE run = :run
)
SELECT (SELECT count(*) FROM keyed) AS calls,
       (SELECT count(*) FROM downstream.requests AS q JOIN keyed USING (idempotency_key)
         WHERE q.service = 'payments') AS requests,
       (SELECT count(*) FROM downstream.refunds JOIN keyed USING (idempotency_key)) AS refunds,
       (SELECT count(DISTINCT idempotency_key) FROM downstream.refunds
          JOIN keyed USING (idempotency_key)) AS refunded_calls,
       (SELECT count(*) FROM downstream.side_effects AS e JOIN keyed USING (idempotency_key)
         WHERE e.service = 'payments') AS side_effects,
       (SELECT count(*) FROM downstream.side_effects AS e JOIN keyed USING (idempotency_key)
         WHERE e.service = 'payments' AND e.action = 'refund'
           AND e.fencing_token = keyed.generation) AS fenced,
       (SELECT count(*) FROM downstream.rejections AS j JOIN keyed USING (idempotency_key)
         WHERE j.service = 'payments') AS rejections
"""


@dataclass(frozen=True)
class Refunds:
    calls: int
    requests: int
    refunds: int
    refunded_calls: int
    side_effects: int
    fenced: int
    rejections: int

    def check(self, what: str) -> None:
        """The provider saw each call once and refunded it once, fenced with the call's
        generation, and refused none."""
        n = self.calls
        if not (
            n > 0
            and self.requests == self.refunds == self.refunded_calls == n
            and self.side_effects == self.fenced == n
            and self.rejections == 0
        ):
            raise BenchError(
                f"{what}: of {n} calls the payments provider got {self.requests} requests, "
                f"made {self.refunds} refunds for {self.refunded_calls} calls and "
                f"{self.side_effects} side effects ({self.fenced} fenced with the call's "
                f"generation), refused {self.rejections}"
            )


def read_refunds(engine: Engine, run: str) -> Refunds:
    with engine.connect() as conn:
        params = {"run": run, "prefix": KEY_PREFIX}
        row = conn.execute(text(REFUNDS_SQL), params).mappings().one()
    return Refunds(**dict(row))


def checked(engine: Engine, run: str, what: str, *, refunds: bool = False) -> Run:
    """The run's figures once its checks held: its own rows, and with ``refunds`` the
    provider's too."""
    found = read(engine, run)
    found.check(what)
    if refunds:
        read_refunds(engine, run).check(what)
    return found


def delete(engine: Engine, run: str) -> None:
    with engine.begin() as conn:
        ids = f"SELECT id FROM {SCHEMA}.calls WHERE run = :run"
        conn.execute(text(f"DELETE FROM {SCHEMA}.outbox WHERE call_id IN ({ids})"), {"run": run})
        conn.execute(text(f"DELETE FROM {SCHEMA}.results WHERE call_id IN ({ids})"), {"run": run})
        conn.execute(text(f"DELETE FROM {SCHEMA}.calls WHERE run = :run"), {"run": run})
