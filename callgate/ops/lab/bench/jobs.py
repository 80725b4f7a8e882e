"""Bare RQ's side of the comparison: module-level job functions an ``rq worker`` imports
(at start-up: ``callgate.ops.lab.bench.rq_worker``).

``refund`` sends the same downstream write as callgate's demo refund (idempotency key,
fence, one transaction at the payments provider) with none of callgate's gate, reservation
or outbox: what a bare queue does for the same work.
"""

from __future__ import annotations

import os
import time
from functools import cache

from callgate.ops.lab.bench import durable
from callgate.ops.lab.demo.downstream import Payments
from callgate.store import db


def noop() -> None:
    """Does nothing: what is left is the queue's own per-job cost."""


def sleep_ms(ms: int) -> None:
    """Waits on I/O for ``ms`` milliseconds (a slow HTTP API, an MCP server)."""
    time.sleep(ms / 1000)


def minimum_durable(call_id: str) -> None:
    """The minimum durable work of one call (``callgate.ops.lab.bench.durable``), nothing
    else: reserve, complete with the result and the outbox row."""
    durable.work(call_id)


def minimum_durable_refund(call_id: str, tenant_id: str, payment_id: str, amount: int) -> None:
    """The minimum durable work around the same refund as ``refund``
    (``callgate.ops.lab.bench.durable.refund``): reserve, refund, complete."""
    durable.refund(call_id, tenant_id, payment_id, amount)


@cache
def _payments() -> Payments:
    return Payments(db.create(os.environ["CALLGATE_DATABASE_URL"], application_name="bench-rq"))


def refund(key: str, tenant_id: str, payment_id: str, amount: int) -> None:
    _payments().refund(
        key=key, fence=1, tenant_id=tenant_id, payment_id=payment_id, amount=amount, currency="KRW"
    )
