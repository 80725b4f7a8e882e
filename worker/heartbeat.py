"""Renews the lease while a handler runs; tells the handler when the lease is gone."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine

from callgate.store import db, reservations

log = logging.getLogger("callgate.worker")


class Heartbeat:
    """Renews every ``lease_seconds / 3`` on its own connection until stopped.

    ``expired()`` is true once the lease can no longer be counted on: a renewal found that
    another worker took the operation over, or the last lease this worker knows it got has
    run out (renewals failed, or the handler held the GIL so long that the renewal thread
    could not run). A handler that did long work asks before it writes
    (``ExecutionContext.ensure_lease``); the downstream's fence and the completion's guard
    refuse a stale owner either way.
    """

    def __init__(
        self,
        engine: Engine,
        lease: reservations.Lease,
        lease_seconds: float,
        *,
        reserved_at: float | None = None,
        max_seconds: float | None = None,
    ) -> None:
        self.engine = engine
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.lost = threading.Event()
        self.renewals = 0
        # Measured before the statement that granted the lease was sent: the lease runs
        # from a moment no earlier than this, so this estimate never outlives it.
        start = time.monotonic() if reserved_at is None else reserved_at
        self._valid_until = start + lease_seconds
        # A handler may hold its lease this long (the job timeout); then the lease is let go,
        # and the call is taken over as if this worker had died: a hung handler cannot keep
        # its call open forever.
        self._give_up_at = None if max_seconds is None else start + max_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def expired(self) -> bool:
        return self.lost.is_set() or time.monotonic() >= self._valid_until

    def _run(self) -> None:
        interval = self.lease_seconds / 3
        while not self._stop.wait(interval):
            sent = time.monotonic()
            if self._give_up_at is not None and sent >= self._give_up_at:
                log.warning(
                    "operation %s: handler ran past the job timeout; its lease is let go",
                    self.lease.operation_id,
                )
                self.lost.set()
                return
            try:
                with db.autocommit(self.engine) as conn:
                    if not reservations.renew(conn, self.lease, self.lease_seconds):
                        self.lost.set()
                        return
            except Exception as exc:  # keep trying until the lease runs out
                log.warning("lease renewal failed: %s", exc)
                continue
            self._valid_until = sent + self.lease_seconds
            self.renewals += 1
