"""Renews the lease while a handler runs; notices when the lease was lost."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

from store import db, reservations

log = logging.getLogger("callgate.worker")


class Heartbeat:
    """Renews every ``lease_seconds / 3`` on its own connection until stopped.

    A failed renewal means another worker took over (or will): ``lost`` is set and the
    handler's downstream write and the completion are left to the fence to reject.
    """

    def __init__(self, engine: Engine, lease: reservations.Lease, lease_seconds: float) -> None:
        self.engine = engine
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        interval = self.lease_seconds / 3
        while not self._stop.wait(interval):
            try:
                with db.autocommit(self.engine) as conn:
                    if not reservations.renew(conn, self.lease, self.lease_seconds):
                        self.lost.set()
                        return
            except Exception as exc:  # keep trying until the lease runs out
                log.warning("lease renewal failed: %s", exc)
