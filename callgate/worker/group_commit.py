"""Calls that finish together end together: one statement, one commit, for many calls.

The first delivery to hand in its ending leads: it waits up to ``window_seconds`` for the
others still running in this process to hand in theirs (never longer than it takes them; not
at all when it is the only one running), then ends the whole batch and gives each delivery
its own answer: the reads with ``endings.end_reads``, the writes' fenced completions with
``completions.complete_many`` (one statement each kind). Each row keeps its own guard, so a
batch changes nothing a delivery could not have changed alone: a read another delivery
already ended is not ended again, a write whose owner was taken over is fenced out, and only
that row says so.

One row Postgres refuses to store (a value no retry can ever commit) would fail the whole
statement: the batch is then ended row by row, and only that delivery hears of it. A
delivery's job stays in its worker's taken hash until its answer came back, so a worker
killed with endings in hand loses nothing: a sweeper dispatches those reads again, and a
write's lease runs out and it is taken over (its status lookup or its key settles whether
it applied).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from callgate.core.errors import UnstorableValue
from callgate.store import completions, db, endings
from callgate.store.db import Engine

# How long a leading delivery waits for the others running beside it. Short against a
# statement's own round trip on a loaded server; long enough for deliveries that took work
# off the queue together to finish together.
WINDOW_SECONDS = 0.002


@dataclass
class Ticket:
    """One delivery's place among those a leader waits for. ``on_handed``, if set, is called
    once its ending is handed in: the delivery's handler is done, only the commit is left."""

    active: bool = True
    on_handed: Callable[[], None] | None = None


@dataclass
class _Slot:
    ending: endings.Ending | completions.Completion
    retry_seconds: float  # how long its statement is retried through an outage
    done: threading.Event = field(default_factory=threading.Event)
    ended: bool = False
    finished: int = 0  # a write: the calls its completion ended
    successors: list[uuid.UUID] = field(default_factory=list)
    error: BaseException | None = None


class GroupCommit:
    """Per process and engine (``for_engine``): see the module's docstring."""

    def __init__(
        self, engine: Engine, *, window_seconds: float = WINDOW_SECONDS, limit: int = 64
    ) -> None:
        self.engine = engine
        self.window_seconds = window_seconds
        self.limit = limit
        self._cond = threading.Condition()
        self._pending: list[_Slot] = []
        self._leading = False
        self._running = 0  # deliveries between their start and their ending

    def enter(self) -> Ticket:
        """A delivery started: until it hands in its ending or ``leave``s, a leader waits
        for it (up to the window)."""
        with self._cond:
            self._running += 1
        return Ticket()

    def leave(self, ticket: Ticket) -> None:
        """This delivery will hand in no ending here (it ended the call otherwise)."""
        with self._cond:
            self._leave(ticket)

    def _leave(self, ticket: Ticket) -> None:
        if ticket.active:
            ticket.active = False
            self._running -= 1
            self._cond.notify_all()

    def end(
        self, ending: endings.Ending, ticket: Ticket, *, retry_seconds: float
    ) -> tuple[bool, list[uuid.UUID]]:
        """End one read, batched with those finishing now: whether this delivery ended it
        (False: another delivery had), and the calls its ending unblocked."""
        slot = self._join(_Slot(ending, retry_seconds), ticket)
        return slot.ended, slot.successors

    def complete(
        self, completion: completions.Completion, ticket: Ticket, *, retry_seconds: float
    ) -> endings.Finished:
        """Commit one write's completion, batched with those finishing now: won or fenced
        out, the calls it ended, and the calls it unblocked."""
        slot = self._join(_Slot(completion, retry_seconds), ticket)
        return endings.Finished(slot.finished, slot.successors, won=slot.ended)

    def _join(self, slot: _Slot, ticket: Ticket) -> _Slot:
        with self._cond:
            self._pending.append(slot)
            self._leave(ticket)
            lead = not self._leading
            self._leading = True
            self._cond.notify_all()
        if ticket.on_handed is not None:
            handed, ticket.on_handed = ticket.on_handed, None
            handed()
        if lead:
            self._lead()
        slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot

    def _lead(self) -> None:
        deadline = time.monotonic() + self.window_seconds
        with self._cond:
            while (
                self._running > 0
                and len(self._pending) < self.limit
                and (left := deadline - time.monotonic()) > 0
            ):
                self._cond.wait(left)
            batch, self._pending = self._pending, []
            self._leading = False
        _flush(self.engine, batch)


def _flush(engine: Engine, batch: Sequence[_Slot]) -> None:
    reads = [s for s in batch if isinstance(s.ending, endings.Ending)]
    writes = [s for s in batch if isinstance(s.ending, completions.Completion)]
    for kind, run in ((reads, _end_reads), (writes, _complete_writes)):
        if kind:
            # Retried as long as the most patient of its deliveries would retry alone (a
            # write's result exists nowhere else while its lease may still be its own).
            _flush_kind(engine, kind, max(s.retry_seconds for s in kind), run)


_Run = Callable[[Engine, Sequence[_Slot], float], None]


def _flush_kind(engine: Engine, batch: Sequence[_Slot], retry_seconds: float, run: _Run) -> None:
    try:
        try:
            run(engine, batch, retry_seconds)
        except UnstorableValue:
            if len(batch) == 1:
                raise
            for slot in batch:  # one row no retry can store: the others end on their own
                _flush_kind(engine, [slot], retry_seconds, run)
            return
        for slot in batch:
            slot.done.set()
    except BaseException as exc:
        for slot in batch:
            if not slot.done.is_set():
                slot.error = exc
                slot.done.set()


def _end_reads(engine: Engine, batch: Sequence[_Slot], retry_seconds: float) -> None:
    done = endings.end_reads(
        engine,
        [s.ending for s in batch if isinstance(s.ending, endings.Ending)],
        retry_seconds=retry_seconds,
    )
    # Successors of the batch are dispatched once, by its first delivery.
    for i, slot in enumerate(batch):
        assert isinstance(slot.ending, endings.Ending)
        slot.ended = done.ended(slot.ending)
        slot.successors = list(done.successors) if i == 0 else []


def _complete_writes(engine: Engine, batch: Sequence[_Slot], retry_seconds: float) -> None:
    done = completions.complete_many(
        engine,
        [s.ending for s in batch if isinstance(s.ending, completions.Completion)],
        retry_seconds=retry_seconds,
    )
    for i, slot in enumerate(batch):
        assert isinstance(slot.ending, completions.Completion)
        finished = done.finished(slot.ending)
        slot.ended = finished is not None
        slot.finished = finished or 0
        slot.successors = list(done.successors) if i == 0 else []


# The batch every delivery of one engine (one worker process) joins.
for_engine = db.PerEngine(GroupCommit)
