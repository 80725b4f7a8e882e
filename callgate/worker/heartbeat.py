"""Renews the lease while a handler runs; tells the handler when the lease is gone.

One renewal thread per process (per engine) serves every call in flight: each lease is due
every third of its lease, and the leases due together are renewed in one statement
(``reservations.renew_many``, the same guard per lease as ``renew``). A thread per call cost
a thread start and join on every call, including the many that end long before their first
renewal.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from callgate.store import db, reservations
from callgate.store.db import Engine

log = logging.getLogger("callgate.worker")

# A renewal thread with no lease to renew exits after this long (a new lease starts it again).
IDLE_EXIT_SECONDS = 5.0


class Heartbeat:
    """Renews every ``lease_seconds / 3`` until stopped.

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
        self.interval = lease_seconds / 3
        # Measured before the statement that granted the lease was sent: the lease runs
        # from a moment no earlier than this, so this estimate never outlives it.
        start = time.monotonic() if reserved_at is None else reserved_at
        self._valid_until = start + lease_seconds
        # A handler may hold its lease this long (the job timeout); then the lease is let go,
        # and the call is taken over as if this worker had died: a hung handler cannot keep
        # its call open forever.
        self._give_up_at = None if max_seconds is None else start + max_seconds
        self.next_due = 0.0  # set by the renewer when it takes the lease on

    def __enter__(self) -> Heartbeat:
        _renewer(self.engine).add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _renewer(self.engine).remove(self)

    def expired(self) -> bool:
        return self.lost.is_set() or time.monotonic() >= self._valid_until

    # --- called by the renewal thread ----------------------------------------------------

    def gives_up(self, now: float) -> bool:
        """Past the job timeout: let the lease go (once)."""
        if self._give_up_at is None or now < self._give_up_at:
            return False
        log.warning(
            "operation %s: handler ran past the job timeout; its lease is let go",
            self.lease.operation_id,
        )
        self.lost.set()
        return True

    def renewed(self, sent: float) -> None:
        self._valid_until = sent + self.lease_seconds
        self.renewals += 1


class _Renewer:
    """The thread that renews an engine's leases when they fall due."""

    def __init__(self, engine: Engine) -> None:
        self._engine = weakref.ref(engine)  # the registry's key: never keep it alive
        self._leases: dict[int, Heartbeat] = {}
        self._in_flight: set[int] = set()  # leases in the renewal being sent now
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def close(self, wait: float) -> None:
        """Renew no lease again: every lease held now is lost, a lease added later is lost at
        once, and a renewal already sent is waited for (up to ``wait`` seconds), so that once
        this returns no lease's expiry moves any more."""
        deadline = time.monotonic() + wait
        with self._changed:
            self._closed = True
            for h in self._leases.values():
                h.lost.set()
            self._leases.clear()
            self._changed.notify_all()
            while self._in_flight and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))

    def add(self, heartbeat: Heartbeat) -> None:
        with self._changed:
            if self._closed:
                heartbeat.lost.set()
                return
            heartbeat.next_due = time.monotonic() + heartbeat.interval
            self._leases[id(heartbeat)] = heartbeat
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="lease-heartbeat", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def remove(self, heartbeat: Heartbeat) -> None:
        """Stop renewing ``heartbeat``. As a thread of its own did when it was joined, a
        renewal under way finishes first, and one that is overdue (the renewal thread could
        not run: a handler held the GIL) is made now, so a takeover it finds is reported."""
        with self._changed:
            self._leases.pop(id(heartbeat), None)
            while id(heartbeat) in self._in_flight:
                self._changed.wait()
            now = time.monotonic()
            overdue = heartbeat.next_due <= now and not heartbeat.lost.is_set()
            overdue = overdue and not self._closed
            if overdue and heartbeat.gives_up(now):
                return
            if overdue:
                self._in_flight.add(id(heartbeat))  # ``close`` waits for it too
        if overdue:
            self._renew([heartbeat])

    def _run(self) -> None:
        idle_since: float | None = None
        while True:
            with self._changed:
                now = time.monotonic()
                if self._closed:
                    self._thread = None
                    return
                if not self._leases:
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= IDLE_EXIT_SECONDS:
                        self._thread = None
                        return
                    self._changed.wait(IDLE_EXIT_SECONDS)
                    continue
                idle_since = None
                first_due = min(h.next_due for h in self._leases.values())
                if first_due > now:
                    self._changed.wait(first_due - now)
                    continue
                # Every lease due now, and those due within half their interval: renewing a
                # little early only moves the expiry later, and it saves statements.
                due = [h for h in self._leases.values() if h.next_due <= now + h.interval / 2]
                for h in due:
                    h.next_due = now + h.interval  # as a per-call thread waited after each try
                    if h.gives_up(now):
                        self._leases.pop(id(h), None)
                due = [h for h in due if not h.lost.is_set()]
                self._in_flight.update(id(h) for h in due)
            if due:
                self._renew(due)

    def _renew(self, due: list[Heartbeat]) -> None:
        sent = time.monotonic()
        held: reservations.Renewal | None = None
        try:
            engine = self._engine()
            if engine is not None:
                with db.raw_autocommit(engine) as conn:
                    leases = [(h.lease, h.lease_seconds) for h in due]
                    held = reservations.renew_many(conn, leases)
        except Exception as exc:  # keep trying until each lease runs out
            log.warning("lease renewal failed: %s", exc)
        with self._changed:
            self._in_flight.difference_update(id(h) for h in due)
            self._changed.notify_all()
            if held is None:
                return
            for h in due:
                key = (h.lease.operation_id, h.lease.owner_token, h.lease.generation)
                if key in held.renewed:
                    h.renewed(sent)
                elif key in held.busy:  # its row is locked: next round; its expiry still counts
                    continue
                else:  # taken over (or finished): this owner's lease is gone
                    h.lost.set()
                    self._leases.pop(id(h), None)


def stop_renewing(engine: Engine, *, wait: float = 2.0) -> None:
    """Renew none of ``engine``'s leases again (a worker whose grace period ran out): each is
    marked lost, so a handler that asks ``ensure_lease`` before a write learns it, and the
    leases run out on their own for another worker to take the calls over."""
    _renewer(engine).close(wait)


# One renewal thread per engine (per worker process).
_renewer = db.PerEngine(lambda engine: _Renewer(engine))
